"""Job history in a SQL database, written as a projection of the event stream.

SQLite (aiosqlite, `<data dir>/history.sqlite`, WAL) is the embedded default;
PostgreSQL (asyncpg, config `history_dsn`) serves production. One code path
(SQLAlchemy Core's async engine) serves both; Alembic migrations run at rest's
start-up before it serves (migrations/).

- `schema`: the tables and their indexes (one per list filter);
- `projection`: pure: events (with their stream sequence) -> row operations;
- `store`: opens the database, migrates it, applies a batch of operations in one
  transaction that also records the last stream sequence applied;
- `query`: the job list (filters, order, paging, total), a job's attempts and
  events, summaries per state and VC;
- `consumer`: rest's durable pull consumer `history` on PAI_EVENTS, acking only
  after the batch's transaction committed.
"""
