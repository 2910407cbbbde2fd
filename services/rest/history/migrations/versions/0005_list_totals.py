"""The job list's totals at a million jobs for tags and keywords (issue 32).

- SQLite: `tag_counts`, the number of submitted jobs per (tag, user, vc, state),
  kept by triggers on `job_tags` and `jobs` in the writing transaction (as 0004's
  `job_counts`), so the total of a list by one tag, or without some tags, is a sum
  over a few rows instead of a count over every tagged job. A pair (job, tag) is
  counted while the job's row is submitted, whichever of the two rows is written
  first (tags may come before the job's submission is projected). Filled in here
  from the rows already there. PostgreSQL counts (see 0004: no shared counter rows).
- SQLite: `job_keywords` (0004's trigram index of the ids) holds the submitted jobs
  only, as the list does, so a keyword's total is counted in the trigram index alone,
  without reading each match's id and looking its job up; placeholders (a state
  event before its submission) enter it when their submission comes.

A later migration that rebuilds `jobs` or `job_tags` on SQLite (batch_alter_table
copies the table) drops their triggers: it must call 0004's create_count_triggers
and then this revision's create_triggers again.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"

_UPSERT = 'ON CONFLICT (tag, "user", vc, state) DO UPDATE SET n = n + 1'
# The job's row changed in a way the counts see (as 0004's jobs_count_update).
_CHANGED = ('(OLD.submitted_at IS NULL) != (NEW.submitted_at IS NULL) OR OLD."user" != NEW."user" '
            "OR OLD.vc != NEW.vc OR OLD.state != NEW.state")
TAG_TRIGGERS = {
    "job_tags_count_insert": f"""CREATE TRIGGER job_tags_count_insert AFTER INSERT ON job_tags
BEGIN
  INSERT INTO tag_counts (tag, "user", vc, state, n)
  SELECT NEW.tag, "user", vc, state, 1 FROM jobs WHERE id = NEW.job AND submitted_at IS NOT NULL
  {_UPSERT};
END""",
    "job_tags_count_delete": """CREATE TRIGGER job_tags_count_delete AFTER DELETE ON job_tags
BEGIN
  UPDATE tag_counts SET n = n - 1 WHERE tag = OLD.tag
  AND ("user", vc, state) = (SELECT "user", vc, state FROM jobs WHERE id = OLD.job AND submitted_at IS NOT NULL);
END""",
    # rest deletes and inserts a job's tags; an update is counted as both all the same.
    "job_tags_count_update": f"""CREATE TRIGGER job_tags_count_update AFTER UPDATE ON job_tags
BEGIN
  UPDATE tag_counts SET n = n - 1 WHERE tag = OLD.tag
  AND ("user", vc, state) = (SELECT "user", vc, state FROM jobs WHERE id = OLD.job AND submitted_at IS NOT NULL);
  INSERT INTO tag_counts (tag, "user", vc, state, n)
  SELECT NEW.tag, "user", vc, state, 1 FROM jobs WHERE id = NEW.job AND submitted_at IS NOT NULL
  {_UPSERT};
END""",
    "jobs_tag_count_insert": f"""CREATE TRIGGER jobs_tag_count_insert AFTER INSERT ON jobs
WHEN NEW.submitted_at IS NOT NULL
BEGIN
  INSERT INTO tag_counts (tag, "user", vc, state, n)
  SELECT tag, NEW."user", NEW.vc, NEW.state, 1 FROM job_tags WHERE job = NEW.id
  {_UPSERT};
END""",
    "jobs_tag_count_delete": """CREATE TRIGGER jobs_tag_count_delete AFTER DELETE ON jobs
WHEN OLD.submitted_at IS NOT NULL
BEGIN
  UPDATE tag_counts SET n = n - 1 WHERE "user" = OLD."user" AND vc = OLD.vc AND state = OLD.state
  AND tag IN (SELECT tag FROM job_tags WHERE job = OLD.id);
END""",
    "jobs_tag_count_update": f"""CREATE TRIGGER jobs_tag_count_update
AFTER UPDATE OF "user", vc, state, submitted_at ON jobs WHEN {_CHANGED}
BEGIN
  UPDATE tag_counts SET n = n - 1
  WHERE OLD.submitted_at IS NOT NULL AND "user" = OLD."user" AND vc = OLD.vc AND state = OLD.state
  AND tag IN (SELECT tag FROM job_tags WHERE job = OLD.id);
  INSERT INTO tag_counts (tag, "user", vc, state, n)
  SELECT tag, NEW."user", NEW.vc, NEW.state, 1 FROM job_tags WHERE job = NEW.id AND NEW.submitted_at IS NOT NULL
  {_UPSERT};
END""",
}
# The id's own phrase finds its FTS5 row (their rowids are their own: a VACUUM may renumber jobs').
_FORGET = """DELETE FROM job_keywords WHERE job_keywords MATCH '"' || replace(OLD.id, '"', '""') || '"'
  AND id = OLD.id"""
KEYWORD_TRIGGERS = {
    "jobs_keyword_insert": """CREATE TRIGGER jobs_keyword_insert AFTER INSERT ON jobs
WHEN NEW.submitted_at IS NOT NULL
BEGIN
  INSERT INTO job_keywords (id) VALUES (NEW.id);
END""",
    "jobs_keyword_delete": f"""CREATE TRIGGER jobs_keyword_delete AFTER DELETE ON jobs
WHEN OLD.submitted_at IS NOT NULL
BEGIN
  {_FORGET};
END""",
    "jobs_keyword_update": f"""CREATE TRIGGER jobs_keyword_update AFTER UPDATE OF submitted_at ON jobs
WHEN (OLD.submitted_at IS NULL) != (NEW.submitted_at IS NULL)
BEGIN
  {_FORGET} AND OLD.submitted_at IS NOT NULL;
  INSERT INTO job_keywords (id) SELECT NEW.id WHERE NEW.submitted_at IS NOT NULL;
END""",
}
# 0004's, which indexed every row (placeholders too).
OLD_KEYWORD_TRIGGERS = {
    "jobs_keyword_insert": """CREATE TRIGGER jobs_keyword_insert AFTER INSERT ON jobs
BEGIN
  INSERT INTO job_keywords (id) VALUES (NEW.id);
END""",
    "jobs_keyword_delete": f"""CREATE TRIGGER jobs_keyword_delete AFTER DELETE ON jobs
BEGIN
  {_FORGET};
END""",
}


def create_triggers() -> None:
    """The triggers that keep tag_counts and job_keywords (SQLite); tag_counts filled in
    again from the rows, job_keywords cleared of placeholders."""
    for name in [*TAG_TRIGGERS, *KEYWORD_TRIGGERS]:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.execute("DELETE FROM tag_counts")
    op.execute('INSERT INTO tag_counts (tag, "user", vc, state, n) '
               'SELECT t.tag, j."user", j.vc, j.state, count(*) FROM job_tags t JOIN jobs j ON j.id = t.job '
               'WHERE j.submitted_at IS NOT NULL GROUP BY t.tag, j."user", j.vc, j.state')
    # Few or none: a placeholder lives only until its submission is applied.
    bind = op.get_bind()
    for (job,) in bind.execute(sa.text("SELECT id FROM jobs WHERE submitted_at IS NULL")).all():
        bind.execute(sa.text("DELETE FROM job_keywords WHERE job_keywords MATCH :phrase AND id = :job"),
                     {"phrase": '"' + job.replace('"', '""') + '"', "job": job})
    for trigger in [*TAG_TRIGGERS.values(), *KEYWORD_TRIGGERS.values()]:
        op.execute(trigger)


def upgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    op.create_table(
        "tag_counts",
        sa.Column("tag", sa.String(64), primary_key=True),
        sa.Column("user", sa.String(128), primary_key=True),
        sa.Column("vc", sa.String(256), primary_key=True),
        sa.Column("state", sa.String(16), primary_key=True),
        sa.Column("n", sa.BigInteger, nullable=False),
        sqlite_with_rowid=False,
    )
    create_triggers()


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for name in [*TAG_TRIGGERS, *KEYWORD_TRIGGERS]:
        op.execute(f"DROP TRIGGER IF EXISTS {name}")
    op.drop_table("tag_counts")
    op.execute("INSERT INTO job_keywords (id) SELECT id FROM jobs WHERE submitted_at IS NULL")
    for trigger in OLD_KEYWORD_TRIGGERS.values():
        op.execute(trigger)
