"""jobs.archived_at and jobs.submission: a finished job's live records leave the
buckets once the history holds it (services/rest/history/expiry.py). `submission`
keeps the job as accepted at intake (its config, warnings, tags; secrets masked) so
its reads answer the same from here; `archived_at` says when job.archived went out.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("archived_at", sa.Float))
        batch.add_column(sa.Column("submission", sa.Text))
    # The expiry sweep's question: finished, not yet archived, finished before a time.
    op.create_index("ix_jobs_archive", "jobs", ["archived_at", "completed_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_archive", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submission")
        batch.drop_column("archived_at")
