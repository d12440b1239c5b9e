"""api_keys.hint (the key's last characters, to tell keys apart in a list) and revoked_at

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    columns = {c["name"] for c in sa.inspect(op.get_bind()).get_columns("api_keys")}
    with op.batch_alter_table("api_keys") as batch:
        # keys made before this have no hint (only their hash was kept): listed without one
        if "hint" not in columns:
            batch.add_column(sa.Column("hint", sa.String(length=16), nullable=True))
        if "revoked_at" not in columns:
            batch.add_column(sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("hint")
