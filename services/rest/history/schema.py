"""The history tables (SQLAlchemy Core), as the newest migration leaves them.

Times are seconds since the epoch (float), as in the events. Every row carries the
stream sequence of the event that last changed it (`*_seq`): an update applies only
when its event is newer than the row, so a replayed or reordered event (two rest
replicas sharing the durable) changes nothing twice and never undoes a later one.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# OpenPAI's ids are short (user <= 64, name <= 128 + "~"): bounded strings index well everywhere.
JOB_ID = sa.String(256)

jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", JOB_ID, primary_key=True),  # user~name
    sa.Column("user", sa.String(128), nullable=False),
    sa.Column("name", sa.String(256), nullable=False),
    sa.Column("vc", sa.String(256), nullable=False, server_default=""),
    sa.Column("state", sa.String(16), nullable=False, server_default="WAITING"),
    sa.Column("state_seq", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("priority_class", sa.String(64)),
    sa.Column("priority", sa.Integer),
    sa.Column("submitted_at", sa.Float),  # null: a state event came before the submission (replicas)
    sa.Column("started_at", sa.Float),  # the current attempt's RUNNING
    sa.Column("completed_at", sa.Float),
    sa.Column("attempt", sa.Integer, nullable=False, server_default="1"),
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("exit_code", sa.Integer),
    sa.Column("exit_phrase", sa.String(256)),
    sa.Column("waiting_reason", sa.Text),  # the scheduler's word while it waits
    sa.Column("stop_requested_by", sa.String(128)),
    sa.Column("tags", sa.Text, nullable=False, server_default="[]"),  # JSON list; job_tags indexes them
    sa.Column("spec", sa.Text),  # the submitted JobSpec as JSON (secrets never reach an event)
    sa.Column("item", sa.String(512)),  # the marketplace item it came from, if any
    sa.Column("submitted_seq", sa.BigInteger, nullable=False, server_default="0"),
    # Revision 2 (0002_task_counts): the list's totalTaskNumber and totalGpuNumber without the spec.
    sa.Column("task_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("gpu_count", sa.Integer, nullable=False, server_default="0"),
    # Revision 3 (0003_archived): when job.archived went out (its live records leave the
    # buckets), and the job as accepted at intake (SubmittedJob JSON) kept for its reads.
    sa.Column("archived_at", sa.Float),
    sa.Column("submission", sa.Text),
)
# The list's order (newest first) with the id as tie-breaker: keyset paging and offset
# both walk this index. One per filter, each ending in the order.
sa.Index("ix_jobs_submitted", jobs.c.submitted_at, jobs.c.id)
sa.Index("ix_jobs_user", jobs.c.user, jobs.c.submitted_at, jobs.c.id)
sa.Index("ix_jobs_vc", jobs.c.vc, jobs.c.submitted_at, jobs.c.id)
sa.Index("ix_jobs_state", jobs.c.state, jobs.c.submitted_at, jobs.c.id)
sa.Index("ix_jobs_archive", jobs.c.archived_at, jobs.c.completed_at)
# Revision 4 (0004_list_at_scale): each of the list's other orders walks an index ending
# in the id (the tie-breaker); rows without a nullable order column (listed after the
# others, by id) have a partial index each.
ORDER_INDEXES = {
    "name": sa.Index("ix_jobs_order_name", jobs.c.name, jobs.c.id),
    "user": sa.Index("ix_jobs_order_user", jobs.c.user, jobs.c.id),
    "vc": sa.Index("ix_jobs_order_vc", jobs.c.vc, jobs.c.id),
    "state": sa.Index("ix_jobs_order_state", jobs.c.state, jobs.c.id),
    "retries": sa.Index("ix_jobs_order_retries", jobs.c.retries, jobs.c.id),
    "gpu_count": sa.Index("ix_jobs_order_gpu", jobs.c.gpu_count, jobs.c.id),
    "task_count": sa.Index("ix_jobs_order_tasks", jobs.c.task_count, jobs.c.id),
    "completed_at": sa.Index("ix_jobs_order_completed", jobs.c.completed_at, jobs.c.id),
    "priority": sa.Index("ix_jobs_order_priority", jobs.c.priority, jobs.c.id),
}
sa.Index("ix_jobs_uncompleted", jobs.c.id, sqlite_where=jobs.c.completed_at.is_(None),
         postgresql_where=jobs.c.completed_at.is_(None))
# Jobs found by id (tagged, matching a keyword) tested for being submitted without their wide rows.
sa.Index("ix_jobs_id_submitted", jobs.c.id, jobs.c.submitted_at)
sa.Index("ix_jobs_no_priority", jobs.c.id, sqlite_where=jobs.c.priority.is_(None),
         postgresql_where=jobs.c.priority.is_(None))
# Keyword: a substring of the id. PostgreSQL has a trigram index on lower(id) (0004);
# SQLite an FTS5 trigram table `job_keywords` (id) of the submitted jobs kept by triggers
# (0004, 0005), read with raw SQL (query.py): a virtual table is no SQLAlchemy Table.

# SQLite only (0004): submitted jobs per (user, vc, state), kept by triggers on `jobs`
# in the writing transaction, so a list's total is a sum over a few rows. PostgreSQL
# counts with index-only scans (shared counter rows would serialise concurrent writers).
job_counts = sa.Table(
    "job_counts",
    metadata,
    sa.Column("user", sa.String(128), primary_key=True),
    sa.Column("vc", sa.String(256), primary_key=True),
    sa.Column("state", sa.String(16), primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
)

# SQLite only (0005): submitted jobs per (tag, user, vc, state), kept by triggers on
# `job_tags` and `jobs`, so a total by one tag (or without some) is a sum over a few rows.
tag_counts = sa.Table(
    "tag_counts",
    metadata,
    sa.Column("tag", sa.String(64), primary_key=True),
    sa.Column("user", sa.String(128), primary_key=True),
    sa.Column("vc", sa.String(256), primary_key=True),
    sa.Column("state", sa.String(16), primary_key=True),
    sa.Column("n", sa.BigInteger, nullable=False),
)

job_tags = sa.Table(
    "job_tags",
    metadata,
    sa.Column("job", JOB_ID, primary_key=True),
    sa.Column("tag", sa.String(64), primary_key=True),
)
sa.Index("ix_job_tags_tag", job_tags.c.tag, job_tags.c.job)

attempts = sa.Table(
    "attempts",
    metadata,
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

tasks = sa.Table(
    "tasks",
    metadata,
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

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.String(512), primary_key=True),  # the event's deterministic id
    sa.Column("job", JOB_ID, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("attempt", sa.Integer),
    sa.Column("type", sa.String(8), nullable=False),  # Normal | Warning
    sa.Column("reason", sa.String(64), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("subject", sa.String(512), nullable=False),  # the job or "<job>/<role>/<index>"
)
sa.Index("ix_events_job", events.c.job, events.c.at)

# The projection's place in the stream: the highest sequence whose batch committed.
progress = sa.Table(
    "progress",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("applied", sa.BigInteger, nullable=False, server_default="0"),  # events applied in all
    sa.Column("at", sa.Float, nullable=False),  # when the last batch committed
)
