"""eval_records: every held-out problem's outcome and completion at each eval of a job

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "eval_records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.String(length=200), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("strict_correct", sa.Boolean(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "step", "idx", name="uq_eval_records_job_step_idx"),
    )
    with op.batch_alter_table("eval_records", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_eval_records_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("eval_records", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_eval_records_job_id"))
    op.drop_table("eval_records")
