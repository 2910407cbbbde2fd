"""jobs.task_count and jobs.gpu_count: the list's totalTaskNumber and totalGpuNumber
without decoding each row's spec; filled in from the spec of the jobs already there.
PostgreSQL also gets a trigram index for the keyword filter (a substring of the
name), where the pg_trgm extension can be had.

Revision ID: 0002
Revises: 0001
"""

import json
import logging

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

log = logging.getLogger("pai.rest.history")
BACKFILL_PAGE = 5000


def _counts(spec: str | None) -> tuple[int, int]:
    if not spec:
        return 0, 0
    try:
        roles = json.loads(spec).get("taskRoles") or []
        tasks = sum(int(r.get("instances", 1)) for r in roles)
        gpus = sum(int(r.get("instances", 1)) * int((r.get("resources") or {}).get("gpu", 0)) for r in roles)
    except (ValueError, TypeError, AttributeError):
        return 0, 0  # a spec this revision cannot read: counts unknown, the row stays
    return tasks, gpus


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("task_count", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("gpu_count", sa.Integer, nullable=False, server_default="0"))
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.String), sa.column("spec", sa.Text),
                    sa.column("task_count", sa.Integer), sa.column("gpu_count", sa.Integer))
    after = ""
    while True:  # in pages by id, so a large history is not read whole
        rows = bind.execute(sa.select(jobs.c.id, jobs.c.spec).where(jobs.c.id > after).order_by(jobs.c.id)
                            .limit(BACKFILL_PAGE)).all()
        if not rows:
            break
        updates = [{"key": row.id, "tasks": t, "gpus": g} for row in rows for t, g in [_counts(row.spec)]]
        bind.execute(sa.update(jobs).where(jobs.c.id == sa.bindparam("key"))
                     .values(task_count=sa.bindparam("tasks"), gpu_count=sa.bindparam("gpus")), updates)
        after = rows[-1].id
    if bind.dialect.name == "postgresql":
        try:
            with bind.begin_nested():
                op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
                op.execute("CREATE INDEX ix_jobs_name_trgm ON jobs USING gin (lower(name) gin_trgm_ops)")
        except sa.exc.DBAPIError as exc:
            log.warning("no trigram index for the keyword filter (pg_trgm: %s); keyword lists scan the names", exc)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_jobs_name_trgm")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_count")
        batch.drop_column("task_count")
