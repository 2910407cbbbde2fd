"""Reads of the history: the job list (filters, order, paging, total), a job's
attempts, tasks and events, and summaries per state and VC for the portal.

Rows come back in OpenPAI's shapes (times in ms since the epoch), as the live
API answers them (services/rest/views.py), so a route can serve either.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from services.rest.history.schema import attempts, events, job_counts, job_tags, jobs, tag_counts, tasks

# The list's order fields (GET /api/v2/jobs `order`, as jobs_api.ORDER_FIELDS names them) -> columns.
ORDER_COLUMNS = {
    "createdTime": jobs.c.submitted_at, "completedTime": jobs.c.completed_at, "name": jobs.c.name,
    "username": jobs.c.user, "virtualCluster": jobs.c.vc, "state": jobs.c.state, "retries": jobs.c.retries,
    "totalGpuNumber": jobs.c.gpu_count, "totalTaskNumber": jobs.c.task_count, "priority": jobs.c.priority,
}


class JobFilter(msgspec.Struct, frozen=True, kw_only=True):
    """Which jobs, in what order, which page. Every filter optional."""

    user: str | None = None
    vc: str | None = None
    states: frozenset[str] = frozenset()
    keyword: str | None = None  # a substring of the job id, any case
    tags_any: frozenset[str] = frozenset()
    tags_none: frozenset[str] = frozenset()
    submitted_from: float | None = None  # seconds since the epoch, inclusive
    submitted_until: float | None = None  # exclusive
    order_field: str = "createdTime"
    descending: bool = True
    offset: int = 0
    limit: int = 1000
    # Keyset paging in the default order: the (submitted_at, id) of the last row of the previous page.
    after: tuple[float, str] | None = None


def _ms(t: float | None) -> int | None:
    return None if t is None else int(t * 1000)


# A keyword this long or longer is looked up in SQLite's trigram index (job_keywords, 0004);
# a shorter one tests every id.
TRIGRAM = 3
_keyword_ids = sa.table("job_keywords", sa.column("id"))


def _phrase(keyword: str) -> str:
    """The FTS5 query of a keyword: a phrase of trigrams is exactly a substring (the
    tokenizer folds case; ids are ASCII)."""
    return '"' + keyword.lower().replace('"', '""') + '"'


def _keyword(keyword: str, dialect: str, *, indexed: bool = True, found: list[str] | None = None) -> Any:
    """Jobs whose id holds the keyword. SQLite: `indexed`, as the set of jobs the trigram
    index finds (a count or page visits only them); otherwise tested row by row (a page
    walking the list's order, when matches are so many that its rows come first)."""
    keyword = keyword.lower()
    pattern = "%" + keyword.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    if dialect != "sqlite":
        return sa.func.lower(jobs.c.id).like(pattern, escape="\\")  # PostgreSQL: the trigram index on lower(id)
    if found is not None:  # the matches, already read from the trigram index
        return jobs.c.id.in_(_among(found, dialect))
    if indexed and len(keyword) >= TRIGRAM:
        return jobs.c.id.in_(sa.select(_keyword_ids.c.id).where(sa.text("job_keywords MATCH :phrase")
                                                                 .bindparams(phrase=_phrase(keyword))))
    return jobs.c.id.like(pattern, escape="\\")  # SQLite's LIKE ignores ASCII case


def _among(ids: list[str], dialect: str) -> Any:
    """The set of these job ids, to test `jobs.id IN` it. SQLite: one JSON parameter read by
    json_each, instead of a parameter per id (rest leaves out up to thousands on every
    page: rendering and binding each cost more CPU than the query)."""
    if dialect == "sqlite":
        return sa.select(sa.func.json_each(json.dumps(ids)).table_valued("value").c.value).scalar_subquery()
    return ids


def _tagged(tags: frozenset[str], *, driving: bool) -> Any:
    """Jobs with one of the tags. `driving`: as the set of such jobs (read from the tag
    index: a count visits only them); otherwise tested row by row (a page walking the
    list's order stops after its rows)."""
    if driving:
        return jobs.c.id.in_(sa.select(job_tags.c.job).where(job_tags.c.tag.in_(sorted(tags))))
    return sa.exists().where(job_tags.c.job == jobs.c.id, job_tags.c.tag.in_(sorted(tags)))


def _where(f: JobFilter, dialect: str = "sqlite", *, counting: bool = False, keyword_indexed: bool = True,
           keyword_found: list[str] | None = None) -> list[Any]:
    where: list[Any] = [jobs.c.submitted_at.is_not(None)]  # placeholders wait for their submission
    if f.user is not None:
        where.append(jobs.c.user == f.user)
    if f.vc is not None:
        where.append(jobs.c.vc == f.vc)
    if f.states:
        where.append(jobs.c.state.in_(sorted(f.states)))
    if f.keyword:
        where.append(_keyword(f.keyword, dialect, indexed=keyword_indexed, found=keyword_found))
    if f.tags_any:
        where.append(_tagged(f.tags_any, driving=counting))
    if f.tags_none:
        where.append(~_tagged(f.tags_none, driving=False))
    if f.submitted_from is not None:
        where.append(jobs.c.submitted_at >= f.submitted_from)
    if f.submitted_until is not None:
        where.append(jobs.c.submitted_at < f.submitted_until)
    return where


def _order(f: JobFilter) -> list[Any]:
    """The order of rows having the order column (a nullable column's rows without it
    come after them, by id ascending: _page). Each walks an index (column, id)."""
    column = ORDER_COLUMNS[f.order_field]
    primary = column.desc() if f.descending else column.asc()
    tie = jobs.c.id.desc() if f.descending else jobs.c.id.asc()
    return [primary, tie]


def _counted_by_table(f: JobFilter) -> bool:
    """Whether the count tables (SQLite) answer the filter's total: user, VC and state
    (job_counts), and with them one tag (tag_counts, 0005)."""
    return not (f.keyword or len(f.tags_any) > 1 or f.tags_none or f.submitted_from is not None
                or f.submitted_until is not None)


def _keyword_alone(f: JobFilter) -> bool:
    """A keyword the trigram index answers with no other filter (SQLite: since 0005 the
    index holds exactly the submitted jobs, the list's rows)."""
    return (f.keyword is not None and len(f.keyword) >= TRIGRAM and f.user is None and f.vc is None
            and not (f.states or f.tags_any or f.tags_none) and f.submitted_from is None
            and f.submitted_until is None)


# A total with a keyword counts at most this many matches (SQLite and PostgreSQL): a
# keyword that most ids hold (a user's name is in every id of theirs) would have every
# page count all of them, and SQLite's trigram index reads each of its trigrams' whole
# lists for that (tens of ms at a million jobs). Past it the total is a lower bound,
# which the API says (jobs_api: X-Total-Count-Capped).
KEYWORD_TOTAL_MAX = 1000


class Total(msgspec.Struct, frozen=True):
    n: int
    capped: bool = False  # n is a lower bound: the count stopped at KEYWORD_TOTAL_MAX matches


async def _total(connection: Any, f: JobFilter, left_out: int) -> Total:
    """How many jobs match, but the `left_out` matching ones (_left_out_matching): the
    count of every match less those, so no row of the count is tested against the
    left-out set. A capped count less them is still a lower bound."""
    cap = KEYWORD_TOTAL_MAX if f.keyword else None
    total = await _count(connection, f, cap)
    return Total(total - left_out, cap is not None and total >= cap)


async def _count(connection: Any, f: JobFilter, cap: int | None = None) -> int:
    """How many jobs match (up to `cap`), reading as few rows as it can: job_counts for
    user/VC/state and tag_counts for one tag with them (SQLite), the tag index for tags,
    the trigram index for a keyword (alone, without reading the matches' rows); the rows
    matching `none of these tags` are those without that filter less those having one
    of them (not with a cap: a difference of two capped counts bounds nothing)."""
    dialect = connection.dialect.name
    if f.tags_none and not f.tags_any and cap is None:
        base = msgspec.structs.replace(f, tags_none=frozenset())
        return await _count(connection, base) - await _count(connection, msgspec.structs.replace(
            base, tags_any=f.tags_none))
    if dialect == "sqlite" and _counted_by_table(f):
        table = tag_counts if f.tags_any else job_counts
        counted = [table.c[name] == value for name, value in (("user", f.user), ("vc", f.vc)) if value is not None]
        if f.states:
            counted.append(table.c.state.in_(sorted(f.states)))
        if f.tags_any:
            counted.append(table.c.tag == next(iter(f.tags_any)))
        return int((await connection.execute(sa.select(sa.func.coalesce(sa.func.sum(table.c.n), 0))
                                             .where(*counted))).scalar_one())
    if dialect == "sqlite" and f.keyword is not None and _keyword_alone(f):
        found = sa.select(_keyword_ids.c.id).where(sa.text("job_keywords MATCH :phrase")
                                                   .bindparams(phrase=_phrase(f.keyword)))
    else:
        found = sa.select(jobs.c.id).where(*_where(f, dialect, counting=True))
    if cap is not None:
        found = found.limit(cap)
    return int((await connection.execute(sa.select(sa.func.count()).select_from(found.subquery()))).scalar_one())


# Walking the list's order with a row-by-row keyword test visits about (offset + limit) *
# jobs / matches rows; reading the matches from the trigram index costs at least this many
# times more per match than the walk per row (benchmarks/history_scale.py, SQLite 3.40): a
# keyword's capped total (KEYWORD_TOTAL_MAX) walks the first page at a million jobs.
WALK_COST_RATIO = 32


async def _keyword_walks(connection: Any, f: JobFilter, total: Total) -> bool:
    """Whether a keyword page (SQLite) walks the list's order testing each id, rather
    than reading every match from the trigram index: when matches are so many that the
    page's rows come after few rows of the walk (a keyword whose trigrams most ids hold
    costs the index a read of each of them)."""
    if connection.dialect.name != "sqlite" or f.keyword is None or len(f.keyword) < TRIGRAM:
        return False
    others = msgspec.structs.replace(f, keyword=None)
    if not _counted_by_table(others):
        return False
    jobs_in_order = await _count(connection, others)
    return total.n * total.n * WALK_COST_RATIO >= (f.offset + f.limit) * jobs_in_order


async def _left_out_matching(connection: Any, f: JobFilter, excluding: list[str]) -> list[str]:
    """Which of the left-out jobs the history has match the filter: each looked up by id
    and matched here as _where does in SQL (a filter in the query would have the planner
    walk that filter's index instead, e.g. every job of a VC). Only these are left out
    of the page's walk, often none: most jobs rest lays over a page are too new for the
    history to have them, and testing each row walked against the whole set cost a deep
    page more than the walk."""
    among = _among(excluding, connection.dialect.name)
    rows = (await connection.execute(sa.select(jobs.c.id, jobs.c.user, jobs.c.vc, jobs.c.state, jobs.c.submitted_at)
                                     .where(jobs.c.id.in_(among), jobs.c.submitted_at.is_not(None)))).all()
    tags: dict[str, set[str]] = {}
    if f.tags_any or f.tags_none:
        for job, tag in (await connection.execute(sa.select(job_tags.c.job, job_tags.c.tag)
                                                   .where(job_tags.c.job.in_(among)))).all():
            tags.setdefault(job, set()).add(tag)
    keyword = f.keyword.lower() if f.keyword else None
    return [r.id for r in rows if (f.user is None or r.user == f.user) and (f.vc is None or r.vc == f.vc)
            and (not f.states or r.state in f.states) and (keyword is None or keyword in r.id.lower())
            and (not f.tags_any or f.tags_any & tags.get(r.id, set()))
            and not (f.tags_none & tags.get(r.id, set()))
            and (f.submitted_from is None or r.submitted_at >= f.submitted_from)
            and (f.submitted_until is None or r.submitted_at < f.submitted_until)]


async def _page(connection: Any, f: JobFilter, where: list[Any], columns: list[Any] | None = None) -> list[Any]:
    column = ORDER_COLUMNS[f.order_field]
    page = sa.select(*(columns or _LIST_COLUMNS)).where(*where)
    if f.after is not None:
        at, job = f.after
        if f.order_field != "createdTime":
            raise ValueError("keyset paging (after) follows the submission order only")
        newer = (jobs.c.submitted_at < at) | ((jobs.c.submitted_at == at) & (jobs.c.id < job))
        older = (jobs.c.submitted_at > at) | ((jobs.c.submitted_at == at) & (jobs.c.id > job))
        page = page.where(newer if f.descending else older)
    if column is jobs.c.submitted_at or not column.nullable:  # never null in a list (_where)
        return list((await connection.execute(page.order_by(*_order(f)).offset(f.offset).limit(f.limit))).all())
    # As the live list (jobs_api.order_jobs): the rows with the field in its order, then
    # those without it by id ascending in either direction; each part walks its own index.
    present = list((await connection.execute(
        page.where(column.is_not(None)).order_by(*_order(f)).offset(f.offset).limit(f.limit))).all())
    if len(present) == f.limit:
        return present
    if present:
        before = f.offset + len(present)  # every row with the field is before the others
    else:
        before = (await connection.execute(sa.select(sa.func.count()).select_from(
            page.where(column.is_not(None)).subquery()))).scalar_one()
    missing = (await connection.execute(page.where(column.is_(None)).order_by(jobs.c.id.asc())
                                        .offset(max(0, f.offset - before)).limit(f.limit - len(present)))).all()
    return present + list(missing)


def job_row(row: Any) -> dict[str, Any]:
    """One row of GET /api/v2/jobs, from a jobs row."""
    state = row.state
    return {
        "debugId": row.id, "name": row.name, "username": row.user, "state": state, "subState": state,
        "executionType": "STOP" if row.stop_requested_by else "START", "retries": row.retries,
        "totalTaskNumber": row.task_count, "totalGpuNumber": row.gpu_count,
        "createdTime": _ms(row.submitted_at), "completedTime": _ms(row.completed_at), "appExitCode": row.exit_code,
        "virtualCluster": row.vc, "priority": row.priority if row.priority is not None else 0,
        "waitingReason": row.waiting_reason if state == "WAITING" else None,
        "tags": json.loads(row.tags or "[]"),
    }


_LIST_COLUMNS = [jobs.c.id, jobs.c.name, jobs.c.user, jobs.c.state, jobs.c.stop_requested_by, jobs.c.retries,
                 jobs.c.task_count, jobs.c.gpu_count, jobs.c.submitted_at, jobs.c.completed_at, jobs.c.exit_code,
                 jobs.c.vc, jobs.c.priority, jobs.c.waiting_reason, jobs.c.tags]


async def list_jobs(engine: AsyncEngine, f: JobFilter, *, with_total: bool = True,
                    excluding: frozenset[str] | set[str] = frozenset()) -> tuple[int | None, list[dict]]:
    """(how many match, or None without `with_total`; the page): list_page's, the total
    a lower bound where a keyword's count was capped."""
    total, rows, _ = await list_page(engine, f, with_total=with_total, excluding=excluding)
    return (None if total is None else total.n), rows


# What a row's list field reads as in job_row (the API's units), by order field: the rows
# rest lays over a page are merged with the database's in Python by these.
_ORDER_VALUES = {
    "createdTime": lambda r: _ms(r.submitted_at), "completedTime": lambda r: _ms(r.completed_at),
    "priority": lambda r: r.priority if r.priority is not None else 0,
}


def _order_key(f: JobFilter, row: Any) -> SimpleNamespace:
    """A window row as far as the list's order reads it (the field of job_row and the id)."""
    value = _ORDER_VALUES.get(f.order_field)
    return SimpleNamespace(debugId=row.id, **{f.order_field: value(row) if value else row[1]})


async def list_page(engine: AsyncEngine, f: JobFilter, *, with_total: bool = True,
                    excluding: frozenset[str] | set[str] = frozenset(),
                    place: Callable[[list[Any]], tuple[int, int]] | None = None,
                    ) -> tuple[Total | None, list[dict], int]:
    """(how many match, or None without `with_total`; the page; how many of the page's
    first rows were not read) in one read transaction. `excluding`: job ids left out
    (rest overlays its own newer rows of them). `place`: given the page's rows as far as
    the order reads them, which of them [p, q) are wanted in full (overlay.on_page: of a
    window that rows laid over it make longer than the page, those that land on it), so
    only those are read in full (a deep page reads hundreds of rows for twenty)."""
    async with engine.connect() as connection:
        dialect = connection.dialect.name
        await read_snapshot(connection)
        left_out = sorted(await _left_out_matching(connection, f, sorted(excluding))) if excluding else []
        found = None
        if with_total and dialect == "sqlite" and _keyword_alone(f):
            # Up to the cap, the matches themselves: their number is the count, and the page
            # looks them up instead of asking the trigram index again.
            assert f.keyword is not None
            found = list((await connection.execute(
                sa.select(_keyword_ids.c.id).where(sa.text("job_keywords MATCH :phrase").bindparams(
                    phrase=_phrase(f.keyword))).limit(KEYWORD_TOTAL_MAX))).scalars())
            total: Total | None = Total(len(found) - len(left_out), len(found) >= KEYWORD_TOTAL_MAX)
        else:
            total = await _total(connection, f, len(left_out)) if with_total else None
        walk = total is not None and await _keyword_walks(connection, f, total)
        where = _where(f, dialect, keyword_indexed=not walk,
                       keyword_found=found if found is not None and not walk and len(found) < KEYWORD_TOTAL_MAX
                       else None)
        if left_out:
            where.append(jobs.c.id.not_in(_among(left_out, dialect)))
        if place is None:
            return total, [job_row(row) for row in await _page(connection, f, where)], 0
        keys = await _page(connection, f, where, [jobs.c.id, ORDER_COLUMNS[f.order_field]])
        p, q = place([_order_key(f, k) for k in keys])
        wanted = [k.id for k in keys[p:q]]
        full = {row.id: row for row in (await connection.execute(
            sa.select(*_LIST_COLUMNS).where(jobs.c.id.in_(wanted)))).all()} if wanted else {}
    return total, [job_row(full[job]) for job in wanted if job in full], p


async def read_snapshot(connection: Any) -> None:
    """Begin a read transaction, so that every read on `connection` until it closes sees one
    state of the database. Python's sqlite3 driver begins one only before a write, so
    each SELECT saw the latest commit: a page's left-out check and its walk could straddle
    the projection's commit of a job rest lays over the page, which then showed twice.
    PostgreSQL's default (read committed) has the same gap between statements: there the
    transaction SQLAlchemy begins is made repeatable read, one snapshot for all of them."""
    if connection.dialect.name == "sqlite":
        await connection.exec_driver_sql("BEGIN")
    elif connection.dialect.name == "postgresql":
        await connection.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


async def rows_of(engine: AsyncEngine, ids: list[str]) -> dict[str, dict[str, Any]]:
    """The list rows of these jobs that the history has (submitted ones), by id."""
    async with engine.connect() as connection:
        rows = (await connection.execute(sa.select(*_LIST_COLUMNS).where(jobs.c.id.in_(ids)))).all()
    return {row.id: job_row(row) for row in rows if row.submitted_at is not None}


async def get_job(engine: AsyncEngine, job: str) -> dict[str, Any] | None:
    async with engine.connect() as connection:
        row = (await connection.execute(sa.select(*_LIST_COLUMNS).where(jobs.c.id == job))).first()
    return job_row(row) if row is not None and row.submitted_at is not None else None


async def job_attempts(engine: AsyncEngine, job: str) -> list[dict[str, Any]]:
    """The job's attempts, oldest first, each with its tasks (every task attempt)."""
    async with engine.connect() as connection:
        found = (await connection.execute(
            sa.select(attempts).where(attempts.c.job == job).order_by(attempts.c.attempt))).all()
        task_rows = (await connection.execute(
            sa.select(tasks).where(tasks.c.job == job)
            .order_by(tasks.c.attempt, tasks.c.role, tasks.c.idx, tasks.c.task_attempt))).all()
    by_attempt: dict[int, list[dict[str, Any]]] = {}
    for t in task_rows:
        by_attempt.setdefault(t.attempt, []).append({
            "taskRoleName": t.role, "taskIndex": t.idx, "taskAttempt": t.task_attempt, "taskState": t.state,
            "containerNodeName": t.node, "launchedTime": _ms(t.started_at), "completedTime": _ms(t.completed_at),
            "containerExitCode": t.exit_code, "containerExitSpecCode": t.exit_spec_code,
            "containerExitPhrase": t.exit_phrase, "platformReason": t.platform_reason,
        })
    return [{
        "attemptIndex": a.attempt, "state": a.state, "createdTime": _ms(a.created_at),
        "launchedTime": _ms(a.started_at), "completedTime": _ms(a.completed_at), "exitCode": a.exit_code,
        "exitPhrase": a.exit_phrase, "tasks": by_attempt.get(a.attempt, []),
    } for a in found]


async def job_events(engine: AsyncEngine, job: str, *, type_: str | None = None,
                     reasons: tuple[str, ...] = (), since: float | None = None) -> list[dict[str, Any]]:
    """The job's event log, oldest first, shaped as GET /api/v2/jobs/{job}/events' items;
    `reasons`: those only, `since`: at or after it (seconds)."""
    query = sa.select(events).where(events.c.job == job)
    if type_ is not None:
        query = query.where(events.c.type == type_)
    if reasons:
        query = query.where(events.c.reason.in_(reasons))
    if since is not None:
        query = query.where(events.c.at >= since)
    async with engine.connect() as connection:
        rows = (await connection.execute(query.order_by(events.c.at, events.c.seq))).all()
    return [{"type": r.type, "reason": r.reason, "message": r.message, "firstTimestamp": _ms(r.at),
             "lastTimestamp": _ms(r.at), "count": 1, "attempt": r.attempt, "involvedObject": r.subject}
            for r in rows]


async def summary(engine: AsyncEngine, *, user: str | None = None) -> dict[str, Any]:
    """Jobs per state, and per VC and state, for the portal (one user's with `user`)."""
    query = sa.select(jobs.c.vc, jobs.c.state, sa.func.count()).where(jobs.c.submitted_at.is_not(None))
    if user is not None:
        query = query.where(jobs.c.user == user)
    async with engine.connect() as connection:
        rows = (await connection.execute(query.group_by(jobs.c.vc, jobs.c.state))).all()
    states: dict[str, int] = {}
    vcs: dict[str, dict[str, int]] = {}
    for vc, state, count in rows:
        states[state] = states.get(state, 0) + count
        vcs.setdefault(vc, {})[state] = count
    return {"total": sum(states.values()), "states": states, "virtualClusters": vcs}
