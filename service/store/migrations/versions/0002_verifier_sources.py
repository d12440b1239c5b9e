"""verifier sources (HTTP-registered verifiers, versioned)

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if sa.inspect(bind).has_table("verifier_sources"):  # created by an older build's create_all
        return
    op.create_table(
        "verifier_sources",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("golden", sa.JSON(), nullable=False),
        sa.Column("tenant", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "version", name="uq_verifier_sources_name_version"),
    )
    op.create_index("ix_verifier_sources_name", "verifier_sources", ["name"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_verifier_sources_name", table_name="verifier_sources")
    op.drop_table("verifier_sources")
