"""The history tables: jobs, their tags, attempts, tasks and events, and the
projection's progress.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

JOB_ID = sa.String(256)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", JOB_ID, primary_key=True),
        sa.Column("user", sa.String(128), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("vc", sa.String(256), nullable=False, server_default=""),
        sa.Column("state", sa.String(16), nullable=False, server_default="WAITING"),
        sa.Column("state_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("priority_class", sa.String(64)),
        sa.Column("priority", sa.Integer),
        sa.Column("submitted_at", sa.Float),
        sa.Column("started_at", sa.Float),
        sa.Column("completed_at", sa.Float),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
        sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_phrase", sa.String(256)),
        sa.Column("waiting_reason", sa.Text),
        sa.Column("stop_requested_by", sa.String(128)),
        sa.Column("tags", sa.Text, nullable=False, server_default="[]"),
        sa.Column("spec", sa.Text),
        sa.Column("item", sa.String(512)),
        sa.Column("submitted_seq", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_index("ix_jobs_submitted", "jobs", ["submitted_at", "id"])
    op.create_index("ix_jobs_user", "jobs", ["user", "submitted_at", "id"])
    op.create_index("ix_jobs_vc", "jobs", ["vc", "submitted_at", "id"])
    op.create_index("ix_jobs_state", "jobs", ["state", "submitted_at", "id"])
    op.create_index("ix_jobs_completed", "jobs", ["completed_at"])
    op.create_index("ix_jobs_name", "jobs", ["name"])
    op.create_table(
        "job_tags",
        sa.Column("job", JOB_ID, primary_key=True),
        sa.Column("tag", sa.String(64), primary_key=True),
    )
    op.create_index("ix_job_tags_tag", "job_tags", ["tag", "job"])
    op.create_table(
        "attempts",
        sa.Column("job", JOB_ID, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("created_at", sa.Float),
        sa.Column("started_at", sa.Float),
        sa.Column("completed_at", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_phrase", sa.String(256)),
    )
    op.create_table(
        "tasks",
        sa.Column("job", JOB_ID, primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("role", sa.String(256), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("task_attempt", sa.Integer, primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("node", sa.String(256)),
        sa.Column("started_at", sa.Float),
        sa.Column("completed_at", sa.Float),
        sa.Column("exit_code", sa.Integer),
        sa.Column("exit_spec_code", sa.Integer),
        sa.Column("exit_phrase", sa.String(256)),
        sa.Column("platform_reason", sa.String(256)),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.String(512), primary_key=True),
        sa.Column("job", JOB_ID, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("attempt", sa.Integer),
        sa.Column("type", sa.String(8), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("subject", sa.String(512), nullable=False),
    )
    op.create_index("ix_events_job", "events", ["job", "at"])
    op.create_table(
        "progress",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("applied", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("progress", "events", "tasks", "attempts", "job_tags", "jobs"):
        op.drop_table(table)
