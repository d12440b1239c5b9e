"""training primitives (Tinker-compatible sessions): sessions, models, samplers, requests (futures),
checkpoints and per-step metrics

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

TABLES = ["tinker_metrics", "tinker_samplers", "tinker_requests", "tinker_models", "tinker_sessions",
          "tinker_checkpoints"]


def upgrade() -> None:
    op.create_table('tinker_checkpoints',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('tinker_path', sa.String(length=512), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('base_model', sa.String(length=1024), nullable=False),
    sa.Column('lora_rank', sa.Integer(), nullable=False),
    sa.Column('has_optimizer', sa.Boolean(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('tinker_path')
    )
    op.create_index(op.f('ix_tinker_checkpoints_model_id'), 'tinker_checkpoints', ['model_id'], unique=False)
    op.create_index(op.f('ix_tinker_checkpoints_tenant'), 'tinker_checkpoints', ['tenant'], unique=False)
    op.create_table('tinker_sessions',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('sdk_version', sa.String(length=64), nullable=False),
    sa.Column('display_name', sa.String(length=256), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('finish_reason', sa.Text(), nullable=True),
    sa.Column('worker_state', sa.String(length=16), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('enqueued_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_tinker_sessions_created_at'), 'tinker_sessions', ['created_at'], unique=False)
    op.create_index(op.f('ix_tinker_sessions_status'), 'tinker_sessions', ['status'], unique=False)
    op.create_index(op.f('ix_tinker_sessions_tenant'), 'tinker_sessions', ['tenant'], unique=False)
    op.create_table('tinker_models',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('base_model', sa.String(length=1024), nullable=False),
    sa.Column('lora_rank', sa.Integer(), nullable=False),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('dirty', sa.Boolean(), nullable=False),
    sa.Column('last_state', sa.Integer(), nullable=True),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['tinker_sessions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_tinker_models_session_id'), 'tinker_models', ['session_id'], unique=False)
    op.create_index(op.f('ix_tinker_models_tenant'), 'tinker_models', ['tenant'], unique=False)
    op.create_table('tinker_requests',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('request_id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('payload', sa.LargeBinary(), nullable=False),
    sa.Column('result', sa.LargeBinary(), nullable=True),
    sa.Column('result_proto', sa.Boolean(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('category', sa.String(length=16), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['tinker_sessions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('request_id'),
    sa.UniqueConstraint('target', 'seq', name='uq_tinker_requests_target_seq')
    )
    op.create_index('ix_tinker_requests_session_status', 'tinker_requests', ['session_id', 'status', 'id'],
                    unique=False)
    op.create_table('tinker_samplers',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('session_id', sa.String(length=64), nullable=False),
    sa.Column('tenant', sa.String(length=128), nullable=False),
    sa.Column('base_model', sa.String(length=1024), nullable=False),
    sa.Column('checkpoint_id', sa.Integer(), nullable=True),
    sa.Column('model_id', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['tinker_sessions.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_tinker_samplers_session_id'), 'tinker_samplers', ['session_id'], unique=False)
    op.create_index(op.f('ix_tinker_samplers_tenant'), 'tinker_samplers', ['tenant'], unique=False)
    op.create_table('tinker_metrics',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('model_id', sa.String(length=200), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('data', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['tinker_models.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('model_id', 'step', name='uq_tinker_metrics_model_step')
    )
    op.create_index(op.f('ix_tinker_metrics_model_id'), 'tinker_metrics', ['model_id'], unique=False)


def downgrade() -> None:
    for table in TABLES:  # children first (foreign keys to tinker_sessions / tinker_models)
        op.drop_table(table)
