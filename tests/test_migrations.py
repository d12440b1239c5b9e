"""The Alembic migrations produce exactly the schema the models declare (no drift)."""
from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

import service.tinker.tables  # noqa: F401  (registers the training-primitives tables on Base)
import service.verifier_store  # noqa: F401  (registers its table on Base)
from service.db import Base, init_db


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
