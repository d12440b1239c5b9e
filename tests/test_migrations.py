"""The Alembic migrations produce exactly the schema the models declare (no drift)."""
from __future__ import annotations

import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from service.store.tables import Base, init_db
from tests.conftest import REPO


def test_migrations_match_models(tmp_path):
    engine, _ = init_db(f"sqlite:///{tmp_path / 'm.db'}")
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], diff


def test_migrations_match_models_on_postgres(pg_url):
    engine, _ = init_db(pg_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], diff


def test_alembic_sees_every_table_from_the_tables_module_alone(tmp_path):
    """What `alembic revision --autogenerate` sees: service/store/migrations/env.py imports only
    service.store.tables, so every table must be declared there (a table elsewhere would be proposed
    for dropping). Run in a fresh interpreter, where nothing else has been imported."""
    code = ("from alembic.autogenerate import compare_metadata\n"
            "from alembic.migration import MigrationContext\n"
            "from service.store.tables import Base, init_db\n"
            f"engine, _ = init_db('sqlite:///{tmp_path / 'a.db'}')\n"
            "with engine.connect() as conn:\n"
            "    print(compare_metadata(MigrationContext.configure(conn), Base.metadata))\n"
            "print(sorted(Base.metadata.tables))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    diff, tables = out.stdout.strip().splitlines()[-2:]
    assert diff == "[]"
    for name in ("jobs", "api_keys", "files", "verifier_sources", "tinker_sessions", "tinker_models",
                 "tinker_requests", "tinker_checkpoints", "tinker_metrics", "tinker_samplers"):
        assert f"'{name}'" in tables, (name, tables)
