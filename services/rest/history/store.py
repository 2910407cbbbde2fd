"""The history database: open it (SQLite or PostgreSQL, one code path), migrate it,
apply batches of the projection's operations, each in one transaction with the
stream sequence it reached.

The DSN comes from config `history_dsn`; empty: SQLite at `<data dir>/history.sqlite`
in WAL mode (readers never wait for the writer). `sqlite+aiosqlite:///...` and
`postgresql+asyncpg://user:password@host/db` are what PAI is tested with.
"""

from __future__ import annotations

import asyncio
import logging
import operator
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from services.rest.history import schema
from services.rest.history.projection import Delete, Operation, Upsert

log = logging.getLogger("pai.rest.history")

SQLITE_FILE = "history.sqlite"
PROJECTION = "events"  # the progress row of the event projection
# SQLite: how long a writer waits for another process's transaction (two rest
# processes on one data dir) before its batch fails and is handed again.
SQLITE_BUSY_MS = 10_000


def dsn_for(history_dsn: str, data_dir: Path) -> str:
    """The configured DSN, or the embedded SQLite file under the data dir."""
    if history_dsn:
        return history_dsn
    data_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite+aiosqlite:///{(data_dir / SQLITE_FILE).resolve()}"


def open_engine(dsn: str) -> AsyncEngine:
    """An async engine for `dsn`; SQLite in WAL mode with foreign writers waited for."""
    if dsn.startswith("sqlite"):
        engine = create_async_engine(dsn, connect_args={"timeout": SQLITE_BUSY_MS / 1000})

        @sa.event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            # FULL: a committed batch survives a power loss too (its events are acked after).
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            # Statement journals in memory: every upsert of a batch (an executemany with
            # triggers) keeps the pages it changes until it completes, in case it must be
            # undone alone. In a temporary file that was a write system call per page and
            # a third of the projection's time in SQLite; the batch's own durability is
            # the WAL's, which this does not touch.
            cursor.execute("PRAGMA temp_store=MEMORY")
            cursor.close()

        return engine
    return create_async_engine(dsn, pool_pre_ping=True)


def _insert(connection: AsyncConnection):
    """The dialect's INSERT with ON CONFLICT (SQLite and PostgreSQL spell it alike)."""
    return postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert


# Statements compiled once per dialect and shape, run as the driver's own SQL with
# positional rows: building one (SQLAlchemy's column collections for `excluded`) and
# SQLAlchemy's per-row parameter processing cost more CPU than the database's work.
_STATEMENTS: dict[tuple[str, tuple], _Compiled] = {}


class _Compiled(NamedTuple):
    sql: str
    names: tuple[str, ...]  # the row's columns in the statement's parameter order

    def rows(self, ops: list[Upsert]) -> list[tuple[Any, ...]]:
        if len(self.names) == 1:
            (name,) = self.names
            return [(_row(op)[name],) for op in ops]
        take = operator.itemgetter(*self.names)
        return [take(_row(op)) for op in ops]


def _upsert_statement(connection: AsyncConnection, op: Upsert) -> _Compiled:
    key = (connection.dialect.name, _shape(op))
    compiled = _STATEMENTS.get(key)
    if compiled is None:
        stmt = _build_upsert(connection, op)
        done = stmt.compile(dialect=connection.dialect)
        compiled = _STATEMENTS[key] = _Compiled(done.string, tuple(done.positiontup or ()))
    return compiled


def _build_upsert(connection: AsyncConnection, op: Upsert) -> Any:
    table = schema.metadata.tables[op.table]
    stmt = _insert(connection)(table).values({name: sa.bindparam(name) for name in _row(op)})
    excluded = stmt.excluded
    keys = list(op.key)
    if not op.values and not op.coalesce:
        return stmt.on_conflict_do_nothing(index_elements=keys)
    set_: dict[str, Any] = {name: excluded[name] for name in op.values}
    set_ |= {name: sa.func.coalesce(excluded[name], table.c[name]) for name in op.coalesce}
    where = table.c[op.guard] < excluded[op.guard] if op.guard else None
    return stmt.on_conflict_do_update(index_elements=keys, set_=set_, where=where)


def _row(op: Upsert) -> dict[str, Any]:
    return op.key | op.on_insert | op.coalesce | op.values


async def apply(connection: AsyncConnection, ops: Iterable[Operation]) -> None:
    """Run the operations on `connection` (inside the caller's transaction).

    Upserts of one shape go to the database as one executemany each: their results
    do not depend on their order across shapes (the sequence guards; inserts of
    event rows are independent), and within a shape the order is kept. A Delete is
    a barrier: what comes before it is applied before it, what comes after, after."""
    groups: dict[tuple, list[Upsert]] = {}

    async def flush() -> None:
        for group in groups.values():
            compiled = _upsert_statement(connection, group[0])
            await connection.exec_driver_sql(compiled.sql, compiled.rows(group))
        groups.clear()

    for op in ops:
        if isinstance(op, Delete):
            await flush()
            table = schema.metadata.tables[op.table]
            where = [table.c[name] == value for name, value in op.key.items()]
            if op.seq_column:
                where.append(table.c[op.seq_column] < op.before_seq)
            await connection.execute(sa.delete(table).where(*where))
            continue
        groups.setdefault(_shape(op), []).append(op)
    await flush()


def _shape(op: Upsert) -> tuple:
    return (op.table, tuple(op.key), tuple(op.values), tuple(op.coalesce), tuple(op.on_insert), op.guard)


async def apply_batch(engine: AsyncEngine, ops: Iterable[Operation], last_seq: int, count: int) -> None:
    """One transaction: the operations and the projection's progress (the highest
    sequence applied). Either both are stored or neither is; the caller acks the
    batch's events only after this returns."""
    async with engine.begin() as connection:
        await apply(connection, ops)
        stmt = _insert(connection)(schema.progress)
        await connection.execute(stmt.on_conflict_do_update(
            index_elements=["name"],
            set_={"seq": sa.func.max(schema.progress.c.seq, stmt.excluded.seq)
                  if connection.dialect.name == "sqlite" else sa.func.greatest(schema.progress.c.seq, stmt.excluded.seq),
                  "applied": schema.progress.c.applied + stmt.excluded.applied, "at": stmt.excluded.at},
        ), {"name": PROJECTION, "seq": last_seq, "applied": count, "at": time.time()})


class LocalReads:
    """Point reads of the embedded SQLite database on the event loop's own thread.

    A read through the async engine hands its statement to aiosqlite's thread and
    back, several times (pool, execute, fetch); on a busy machine each hand-over
    waits for the thread to be scheduled, which made every submission (its name
    checked against the archived jobs) wait far longer than the read itself: a
    primary-key lookup in WAL mode takes microseconds and never waits for the
    writer. A read that would wait (a checkpoint holding the file) or fails goes
    back to the async engine: `None`. Not for PostgreSQL (asyncpg has no thread)."""

    BUSY_MS = 20  # the most the loop waits on the file before the async engine is asked instead
    IDS_PER_QUERY = 500  # inside SQLite's limit on a statement's parameters

    def __init__(self, engine: AsyncEngine):
        url = engine.url
        self.path = url.database if url.get_backend_name() == "sqlite" and url.database else None
        self._connection: sqlite3.Connection | None = None

    def archived_among(self, jobs: list[str]) -> set[str] | None:
        """Which of these jobs are archived (as `archived_among`); None: ask the engine."""
        if self.path is None or not jobs:
            return None if self.path is None else set()
        try:
            if self._connection is None:
                self._connection = sqlite3.connect(f"{Path(self.path).as_uri()}?mode=ro", uri=True,
                                                   timeout=self.BUSY_MS / 1000, check_same_thread=False)
            found: set[str] = set()
            for at in range(0, len(jobs), self.IDS_PER_QUERY):
                some = jobs[at:at + self.IDS_PER_QUERY]
                found.update(row[0] for row in self._connection.execute(
                    f"SELECT id FROM jobs WHERE archived_at IS NOT NULL AND id IN ({','.join('?' * len(some))})",
                    some))
        except sqlite3.Error as exc:
            log.debug("history: local read failed (%r); asking the engine", exc)
            self.close()
            return None
        return found

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


async def progress(engine: AsyncEngine) -> tuple[int, int]:
    """(the highest stream sequence applied, events applied in all); (0, 0) before any."""
    async with engine.connect() as connection:
        row = (await connection.execute(
            sa.select(schema.progress.c.seq, schema.progress.c.applied).where(schema.progress.c.name == PROJECTION)
        )).first()
    return (int(row.seq), int(row.applied)) if row else (0, 0)


async def set_tags(engine: AsyncEngine, job: str, tags: list[str]) -> None:
    """A job's tags as the tag API left them (tags are not events: rest writes them here
    after its own record)."""
    import json

    async with engine.begin() as connection:
        await connection.execute(sa.update(schema.jobs).where(schema.jobs.c.id == job).values(tags=json.dumps(tags)))
        await connection.execute(sa.delete(schema.job_tags).where(schema.job_tags.c.job == job))
        if tags:
            await connection.execute(sa.insert(schema.job_tags), [{"job": job, "tag": tag} for tag in tags])


async def replace_tags(engine: AsyncEngine, job: str, expected: str, tags: list[str]) -> bool:
    """An archived job's tags changed to `tags` where `jobs.tags` still reads `expected`
    (compare-and-set: the database is their only copy, so a concurrent change wins and
    the caller reads again).
    False where the row holds other tags, or is gone."""
    import json

    async with engine.begin() as connection:
        changed = await connection.execute(
            sa.update(schema.jobs).where(schema.jobs.c.id == job, schema.jobs.c.tags == expected)
            .values(tags=json.dumps(tags)))
        if changed.rowcount != 1:
            return False
        await connection.execute(sa.delete(schema.job_tags).where(schema.job_tags.c.job == job))
        if tags:
            await connection.execute(sa.insert(schema.job_tags), [{"job": job, "tag": tag} for tag in tags])
    return True


async def archived_among(engine: AsyncEngine, jobs: list[str]) -> set[str]:
    """Which of these jobs are archived: their live records left the buckets, so the
    history's rows are the truth about them (the list shows those rows)."""
    async with engine.connect() as connection:
        rows = (await connection.execute(sa.select(schema.jobs.c.id).where(
            schema.jobs.c.id.in_(jobs), schema.jobs.c.archived_at.is_not(None)))).all()
    return {row.id for row in rows}


async def delete_job(engine: AsyncEngine, job: str, submitted_at: float) -> bool:
    """Every row of the job submitted at `submitted_at` (a deleted archived job), in one
    transaction; the projection's JobDeleted removes the same rows again when it comes
    (nothing then). Whether there was such a job."""
    jobs = schema.jobs
    async with engine.begin() as connection:
        row = (await connection.execute(sa.select(jobs.c.submitted_at).where(jobs.c.id == job))).first()
        if row is None or row.submitted_at is None or abs(row.submitted_at - submitted_at) > 1e-6:
            return False
        for table in (schema.events, schema.tasks, schema.attempts, schema.job_tags):
            await connection.execute(sa.delete(table).where(table.c.job == job))
        await connection.execute(sa.delete(jobs).where(jobs.c.id == job))
    return True


# --- migrations ----------------------------------------------------------------------------

MIGRATIONS = Path(__file__).with_name("migrations")
# PostgreSQL: replicas starting together migrate one at a time (a transaction-level advisory lock).
MIGRATION_LOCK = 0x5041495F48  # "PAI_H"


def _alembic_config(connection: Any):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


async def migrate(engine: AsyncEngine, revision: str = "head") -> None:
    """Upgrade the database to `revision` (the newest by default), in one transaction."""
    from alembic import command

    def upgrade(connection) -> None:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
        command.upgrade(_alembic_config(connection), revision)

    async with engine.begin() as connection:
        await connection.run_sync(upgrade)


async def current_revision(engine: AsyncEngine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    async with engine.connect() as connection:
        return await connection.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


async def open_store(dsn: str) -> AsyncEngine:
    """The engine, its database migrated to the newest revision."""
    engine = open_engine(dsn)
    try:
        await migrate(engine)
    except BaseException:
        await asyncio.shield(engine.dispose())
        raise
    return engine
