"""Alembic environment: runs on the connection that service.store.tables.migrate() hands over."""
from alembic import context

from service.store.tables import Base

target_metadata = Base.metadata
connection = context.config.attributes.get("connection")
if connection is None:  # `alembic` CLI use: build an engine from the URL the settings name
    from service.settings import get_settings
    from service.store.tables import make_engine

    connection = make_engine(get_settings().db_url).connect()

context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
