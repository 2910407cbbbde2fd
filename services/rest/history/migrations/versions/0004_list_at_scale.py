"""The job list at a million jobs (issue 32, benchmarks/history_scale.py).

- Every order the list offers walks an index instead of sorting the whole table:
  (column, id) for each order column, the id being the list's tie-breaker; the
  nullable ones (completed_at, priority) also get a partial index of the rows
  without the value (listed after the others, by id).
- (id, submitted_at): jobs found by id (tagged, matching a keyword) are tested for
  being submitted without reading their wide rows.
- PostgreSQL: the keyword filter's trigram index is on lower(id), as the filter
  reads (0002's was on the name).
- SQLite: `job_keywords`, an FTS5 trigram index of the job ids (kept by triggers on
  `jobs`): a keyword of three characters or more finds its jobs there instead of
  testing every id (a phrase of trigrams is exactly a substring, any ASCII case).
- SQLite: `job_counts`, the number of submitted jobs per (user, vc, state), kept by
  triggers on `jobs` in the writing transaction, so the list's total (every page
  answers it in X-Total-Count) is a sum over a few rows instead of a count over
  every job. Filled in here from the jobs already there. PostgreSQL counts with its
  index-only scans instead: shared counter rows updated by concurrent writers (rest
  replicas sharing the projection) would serialise them and deadlock.
  A later migration that rebuilds `jobs` on SQLite (batch_alter_table copies the
  table) drops its triggers: it must call create_count_triggers again.

Revision ID: 0004
Revises: 0003
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

log = logging.getLogger("pai.rest.history")

ORDER_INDEXES = {  # name -> the order column
    "ix_jobs_order_name": "name", "ix_jobs_order_user": "user", "ix_jobs_order_vc": "vc",
    "ix_jobs_order_state": "state", "ix_jobs_order_retries": "retries", "ix_jobs_order_gpu": "gpu_count",
    "ix_jobs_order_tasks": "task_count", "ix_jobs_order_completed": "completed_at",
    "ix_jobs_order_priority": "priority",
}
NULL_INDEXES = {"ix_jobs_uncompleted": "completed_at", "ix_jobs_no_priority": "priority"}
# A set of jobs found by id (tagged, keyword matches, rows rest overlays) tested for being
# submitted without reading their wide rows (the spec): a tag's total reads ten times fewer pages.
ID_INDEX = ("ix_jobs_id_submitted", ["id", "submitted_at"])

COUNT_TRIGGERS = [
    """CREATE TRIGGER jobs_count_insert AFTER INSERT ON jobs WHEN NEW.submitted_at IS NOT NULL
BEGIN
  INSERT INTO job_counts ("user", vc, state, n) VALUES (NEW."user", NEW.vc, NEW.state, 1)
  ON CONFLICT ("user", vc, state) DO UPDATE SET n = n + 1;
END""",
    """CREATE TRIGGER jobs_count_delete AFTER DELETE ON jobs WHEN OLD.submitted_at IS NOT NULL
BEGIN
  UPDATE job_counts SET n = n - 1 WHERE "user" = OLD."user" AND vc = OLD.vc AND state = OLD.state;
END""",
    """CREATE TRIGGER jobs_count_update AFTER UPDATE OF "user", vc, state, submitted_at ON jobs
WHEN (OLD.submitted_at IS NULL) != (NEW.submitted_at IS NULL) OR OLD."user" != NEW."user" OR OLD.vc != NEW.vc
  OR OLD.state != NEW.state
BEGIN
  UPDATE job_counts SET n = n - 1
  WHERE OLD.submitted_at IS NOT NULL AND "user" = OLD."user" AND vc = OLD.vc AND state = OLD.state;
  INSERT INTO job_counts ("user", vc, state, n) SELECT NEW."user", NEW.vc, NEW.state, 1
  WHERE NEW.submitted_at IS NOT NULL
  ON CONFLICT ("user", vc, state) DO UPDATE SET n = n + 1;
END""",
]
KEYWORD_TRIGGERS = [
    """CREATE TRIGGER jobs_keyword_insert AFTER INSERT ON jobs
BEGIN
  INSERT INTO job_keywords (id) VALUES (NEW.id);
END""",
    # By the id's own phrase: FTS5 rows have their own rowids (a VACUUM may renumber jobs').
    """CREATE TRIGGER jobs_keyword_delete AFTER DELETE ON jobs
BEGIN
  DELETE FROM job_keywords WHERE job_keywords MATCH '"' || replace(OLD.id, '"', '""') || '"' AND id = OLD.id;
END""",
]
TRIGGER_NAMES = ("jobs_count_insert", "jobs_count_delete", "jobs_count_update", "jobs_keyword_insert",
                 "jobs_keyword_delete")


def create_count_triggers() -> None:
    """The triggers that keep job_counts and job_keywords (SQLite), both filled in again from `jobs`."""
    for name in TRIGGER_NAMES:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DELETE FROM job_counts")
    op.execute('INSERT INTO job_counts ("user", vc, state, n) SELECT "user", vc, state, count(*) FROM jobs '
               'WHERE submitted_at IS NOT NULL GROUP BY "user", vc, state')
    op.execute("DELETE FROM job_keywords")
    op.execute("INSERT INTO job_keywords (id) SELECT id FROM jobs")
    for trigger in COUNT_TRIGGERS + KEYWORD_TRIGGERS:
        op.execute(trigger)


def upgrade() -> None:
    bind = op.get_bind()
    for name, column in ORDER_INDEXES.items():
        op.create_index(name, "jobs", [column, "id"])
    for name, column in NULL_INDEXES.items():
        op.create_index(name, "jobs", ["id"], sqlite_where=sa.text(f"{column} IS NULL"),
                        postgresql_where=sa.text(f"{column} IS NULL"))
    op.create_index(ID_INDEX[0], "jobs", ID_INDEX[1])
    # Served by ix_jobs_order_name and ix_jobs_order_completed (their first column).
    op.drop_index("ix_jobs_name", "jobs")
    op.drop_index("ix_jobs_completed", "jobs")
    if bind.dialect.name == "postgresql":
        try:
            with bind.begin_nested():
                op.execute("DROP INDEX IF EXISTS ix_jobs_name_trgm")
                op.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
                op.execute("CREATE INDEX ix_jobs_id_trgm ON jobs USING gin (lower(id) gin_trgm_ops)")
        except sa.exc.DBAPIError as exc:
            log.warning("no trigram index for the keyword filter (pg_trgm: %s); keyword lists scan the ids", exc)
        return
    op.create_table(
        "job_counts",
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("vc", sa.String(256), primary_key=True),
        sa.Column("state", sa.String(16), primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )
    op.execute("CREATE VIRTUAL TABLE job_keywords USING fts5(id, tokenize='trigram')")
    create_count_triggers()


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_jobs_id_trgm")
    else:
        for name in TRIGGER_NAMES:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
        op.execute("DROP TABLE job_keywords")
        op.drop_table("job_counts")
    op.create_index("ix_jobs_completed", "jobs", ["completed_at"])
    op.create_index("ix_jobs_name", "jobs", ["name"])
    for name in [ID_INDEX[0], *NULL_INDEXES, *ORDER_INDEXES]:
        op.drop_index(name, "jobs")
