"""verifier_sources.public: a registered verifier is private to its tenant unless published

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("verifier_sources")}
    if "public" in columns:  # a table created by this build's create_all before the migration ran
        return
    with op.batch_alter_table("verifier_sources") as batch:
        # existing verifiers become private: publishing is an explicit choice of their owner
        batch.add_column(sa.Column("public", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("verifier_sources") as batch:
        batch.drop_column("public")
