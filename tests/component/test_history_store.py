"""The job history database, on SQLite and on a real PostgreSQL: the projection
applied, replayed, interrupted; a migration on a populated database; the queries."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
import sqlalchemy as sa

from libs.common.messages import JobState
from services.rest.history import query, schema, store
from services.rest.history.projection import project_batch
from tests.fixtures import history_events as ev, postgres as pg

_databases = itertools.count()


@pytest.fixture(scope="module")
def postgres_server():
    bindir = pg.binaries()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb and pg_ctl not found): `make test` installs Debian's postgresql")
    server = pg.Postgres(bindir).start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def dsn(request, tmp_path):
    if request.param == "sqlite":
        return store.dsn_for("", tmp_path)
    return request.getfixturevalue("postgres_server")  # the DSN is made in `engine`


@pytest.fixture
async def engine(dsn):
    if isinstance(dsn, pg.Postgres):
        dsn = await dsn.create_database(f"history_{next(_databases)}")
    engine = store.open_engine(dsn)
    yield engine
    await engine.dispose()


async def _migrated(engine):
    await store.migrate(engine)
    return engine


def _numbered(events, start: int = 1):
    return list(enumerate(events, start))


async def _apply(engine, numbered) -> None:
    await store.apply_batch(engine, project_batch(numbered), numbered[-1][0], len(numbered))


async def _dump(engine) -> dict[str, list]:
    """Every row of every projected table, for comparing whole databases."""
    out = {}
    async with engine.connect() as connection:
        for table in (schema.jobs, schema.attempts, schema.tasks, schema.events, schema.job_tags):
            rows = (await connection.execute(sa.select(table).order_by(*table.primary_key.columns))).all()
            out[table.name] = [tuple(row) for row in rows]
    return out


async def test_a_job_lifecycle_lands_in_the_tables(engine):
    await _migrated(engine)
    await _apply(engine, _numbered(ev.lifecycle("alice~a", exit_code=1)))
    total, rows = await query.list_jobs(engine, query.JobFilter())
    assert total == 1
    (row,) = rows
    assert row["debugId"] == "alice~a" and row["state"] == "FAILED" and row["appExitCode"] == 1
    assert row["createdTime"] == int(ev.T0 * 1000) and row["completedTime"] == int((ev.T0 + 4) * 1000)
    assert (row["totalTaskNumber"], row["totalGpuNumber"]) == (2, 2)
    (attempt,) = await query.job_attempts(engine, "alice~a")
    assert attempt["state"] == "FAILED" and attempt["exitPhrase"] == "user error"
    (task,) = attempt["tasks"]
    assert (task["taskState"], task["containerExitCode"], task["containerExitPhrase"]) == ("FAILED", 1, "user error")
    assert task["containerNodeName"] == "node-1"
    reasons = [e["reason"] for e in await query.job_events(engine, "alice~a")]
    assert reasons == ["Submitted", "Running", "TaskFailed", "TaskExplained", "Failed"]
    assert await store.progress(engine) == (6, 6)


async def test_a_replay_of_the_same_events_changes_nothing(engine):
    await _migrated(engine)
    events = _numbered(ev.lifecycle("alice~a") + ev.lifecycle("bob~b", at=ev.T0 + 100, exit_code=2))
    await _apply(engine, events)
    before = await _dump(engine)
    await _apply(engine, events)  # all again, as after a crash before the acks
    await _apply(engine, events[3:5])  # and some of them once more
    assert await _dump(engine) == before


async def test_an_older_event_applied_later_never_undoes_a_newer_one(engine):
    """Two rest replicas share the durable: a batch with the job's end may commit before
    the batch with its start (and its submission)."""
    await _migrated(engine)
    events = _numbered(ev.lifecycle("alice~a"))
    await _apply(engine, events[4:])  # SUCCEEDED first: a placeholder row
    await _apply(engine, events[:4])  # then the submission, RUNNING, the task's start and exit
    in_order = await _dump(engine)
    (row,) = (await query.list_jobs(engine, query.JobFilter()))[1]
    assert row["state"] == "SUCCEEDED" and row["name"] == "a" and row["totalTaskNumber"] == 2
    assert (await query.job_attempts(engine, "alice~a"))[0]["state"] == "SUCCEEDED"
    assert in_order["tasks"][0][5] == "SUCCEEDED"  # the task's exit, not its start


async def test_a_crash_inside_the_transaction_leaves_no_row_and_the_retry_applies_it_once(engine):
    await _migrated(engine)
    events = _numbered([ev.submitted("alice~a"), ev.state("alice~a", JobState.RUNNING)])
    ops = project_batch(events)

    class Crash(Exception):
        pass

    with pytest.raises(Crash):
        async with engine.begin() as connection:  # what apply_batch does, dying before its commit
            await store.apply(connection, ops)
            raise Crash
    assert await query.list_jobs(engine, query.JobFilter()) == (0, [])
    assert await store.progress(engine) == (0, 0)
    await _apply(engine, events)  # the events come back (never acked)
    total, (row,) = await query.list_jobs(engine, query.JobFilter())
    assert total == 1 and row["state"] == "RUNNING"
    assert len(await query.job_events(engine, "alice~a")) == 2


async def test_a_deleted_job_leaves_the_history_and_a_new_one_of_its_name_stays(engine):
    await _migrated(engine)
    await _apply(engine, _numbered(ev.lifecycle("alice~a")))
    await store.set_tags(engine, "alice~a", ["old"])
    await _apply(engine, [(10, ev.deleted("alice~a")), (11, ev.submitted("alice~a", at=ev.T0 + 50))])
    total, (row,) = await query.list_jobs(engine, query.JobFilter())
    assert total == 1 and row["state"] == "WAITING" and row["createdTime"] == int((ev.T0 + 50) * 1000)
    assert row["tags"] == []
    assert await query.job_attempts(engine, "alice~a") == []
    assert [e["reason"] for e in await query.job_events(engine, "alice~a")] == ["Submitted"]


async def test_the_list_filters_orders_and_pages(engine):
    await _migrated(engine)
    events = []
    for i in range(30):
        user = ("alice", "bob", "carol")[i % 3]
        vc = "vc1" if i % 2 else "default"
        events += ev.lifecycle(f"{user}~job{i:02d}", at=ev.T0 + i * 10, exit_code=int(i % 4 == 0), vc=vc)
    await _apply(engine, _numbered(events))
    await store.set_tags(engine, "bob~job01", ["best", "x"])
    await store.set_tags(engine, "alice~job03", ["x"])

    total, rows = await query.list_jobs(engine, query.JobFilter(limit=5))
    assert total == 30 and [r["debugId"] for r in rows] == [
        "carol~job29", "bob~job28", "alice~job27", "carol~job26", "bob~job25"]  # newest first
    # Keyset paging gives the same pages as offsets.
    pages, after = [], None
    while True:
        _, page = await query.list_jobs(engine, query.JobFilter(limit=7, after=after), with_total=False)
        if not page:
            break
        pages += [r["debugId"] for r in page]
        after = (page[-1]["createdTime"] / 1000, page[-1]["debugId"])
    _, everything = await query.list_jobs(engine, query.JobFilter(limit=100))
    assert pages == [r["debugId"] for r in everything]
    _, offset_page = await query.list_jobs(engine, query.JobFilter(offset=7, limit=7))
    assert [r["debugId"] for r in offset_page] == pages[7:14]

    def ids(rows):
        return {r["debugId"] for r in rows}

    assert (await query.list_jobs(engine, query.JobFilter(user="bob")))[0] == 10
    assert (await query.list_jobs(engine, query.JobFilter(vc="vc1")))[0] == 15
    failed = (await query.list_jobs(engine, query.JobFilter(states=frozenset({"FAILED"}))))[1]
    assert ids(failed) == {f"{('alice', 'bob', 'carol')[i % 3]}~job{i:02d}" for i in range(0, 30, 4)}
    assert ids((await query.list_jobs(engine, query.JobFilter(keyword="JOB1")))[1]) == {
        f"{('alice', 'bob', 'carol')[i % 3]}~job{i}" for i in range(10, 20)}
    assert ids((await query.list_jobs(engine, query.JobFilter(keyword="b_1")))[1]) == set()  # _ is no wildcard
    assert ids((await query.list_jobs(engine, query.JobFilter(tags_any=frozenset({"x"}))))[1]) == {
        "bob~job01", "alice~job03"}
    assert (await query.list_jobs(engine, query.JobFilter(tags_none=frozenset({"x"}))))[0] == 28
    window = query.JobFilter(submitted_from=ev.T0 + 100, submitted_until=ev.T0 + 150)
    assert ids((await query.list_jobs(engine, window))[1]) == {
        "bob~job10", "carol~job11", "alice~job12", "bob~job13", "carol~job14"}
    by_name = (await query.list_jobs(engine, query.JobFilter(order_field="name", descending=False, limit=2)))[1]
    assert [r["name"] for r in by_name] == ["job00", "job01"]
    assert json.dumps(rows)  # rows are plain JSON

    summary = await query.summary(engine)
    assert summary["total"] == 30 and summary["states"] == {"FAILED": 8, "SUCCEEDED": 22}
    assert summary["virtualClusters"]["vc1"] == {"SUCCEEDED": 15}
    assert (await query.summary(engine, user="alice"))["total"] == 10


async def test_a_migration_on_a_populated_database(engine):
    """A history written at revision 1 (no task counts) upgraded to the newest: every
    row kept, the new columns filled in from each job's spec."""
    await store.migrate(engine, "0001")
    assert await store.current_revision(engine) == "0001"
    revision_1_columns = {c.name for c in schema.jobs.columns} - {"task_count", "gpu_count"}
    rows = []
    for i in range(12):
        op = project_batch([(i + 1, ev.submitted(f"alice~j{i}", at=ev.T0 + i, instances=i + 1, gpu=i % 3))])[0]
        rows.append({k: v for k, v in store._row(op).items() if k in revision_1_columns})
    rows.append({"id": "alice~broken", "user": "alice", "name": "broken", "spec": "{not json", "submitted_at": ev.T0})
    async with engine.begin() as connection:
        for row in rows:
            columns = ", ".join(f'"{k}"' for k in row)
            await connection.execute(sa.text(f"INSERT INTO jobs ({columns}) VALUES ({', '.join(':' + k for k in row)})"),
                                     row)
    await store.migrate(engine)
    assert await store.current_revision(engine) == "0005"  # the newest (0005: the list's tag counts)
    total, listed = await query.list_jobs(engine, query.JobFilter(limit=100))
    assert total == 13
    counts = {r["debugId"]: (r["totalTaskNumber"], r["totalGpuNumber"]) for r in listed}
    assert counts == {**{f"alice~j{i}": (i + 1, (i + 1) * (i % 3)) for i in range(12)}, "alice~broken": (0, 0)}
    await store.migrate(engine)  # at the newest already: nothing to do
    # And the projection goes on writing at the new revision.
    await _apply(engine, [(100, ev.state("alice~j0", JobState.RUNNING))])
    assert (await query.get_job(engine, "alice~j0"))["state"] == "RUNNING"


async def test_archived_names_read_on_the_loop_agree_with_the_engine(engine):
    """Submissions ask whether their name is an archived job's; on SQLite that read runs on
    the event loop's thread (store.LocalReads) and must answer as the engine does."""
    await _migrated(engine)
    jobs = [f"alice~job{i}" for i in range(3)]
    await _apply(engine, _numbered([e for i, job in enumerate(jobs)
                                    for e in ev.lifecycle(job, at=ev.T0 + i, exit_code=0, vc="default")]))
    async with engine.begin() as connection:
        await connection.execute(sa.update(schema.jobs).where(schema.jobs.c.id.in_(jobs[:2])).values(archived_at=ev.T0))
    asked = [*jobs, "alice~never-submitted", "bob~job0"]
    assert await store.archived_among(engine, asked) == {"alice~job0", "alice~job1"}
    local = store.LocalReads(engine)
    try:
        if engine.dialect.name == "sqlite":
            assert local.archived_among(asked) == {"alice~job0", "alice~job1"}
            # More ids than one statement takes: asked in parts, none lost.
            many = [f"carol~x{i}" for i in range(store.LocalReads.IDS_PER_QUERY * 2)] + ["alice~job1"]
            assert local.archived_among(many) == {"alice~job1"}
        else:
            assert local.archived_among(asked) is None  # PostgreSQL: the engine answers
    finally:
        local.close()


_ROW_FIELDS = {"createdTime": "submitted_at", "completedTime": "completed_at", "name": "name", "username": "user",
               "virtualCluster": "vc", "state": "state", "retries": "retries", "priority": "priority"}
_LIST_CASES = [
    {}, {"user": "bob"}, {"vc": "vc1"}, {"states": frozenset({"FAILED"})},
    {"user": "carol", "states": frozenset({"SUCCEEDED", "RUNNING"})}, {"keyword": "JOB1"}, {"keyword": "b~"},
    {"keyword": "b_1"}, {"keyword": "ob0", "vc": "default"}, {"keyword": "job01"}, {"keyword": "early"},
    {"keyword": "job", "offset": 5, "limit": 4}, {"keyword": "~job", "states": frozenset({"FAILED"})},
    {"tags_any": frozenset({"x"})}, {"tags_any": frozenset({"y"}), "user": "bob"},
    {"tags_any": frozenset({"x"}), "vc": "vc1", "states": frozenset({"SUCCEEDED", "RUNNING"})},
    {"tags_none": frozenset({"x"})}, {"tags_none": frozenset({"x"}), "user": "bob"},
    {"tags_none": frozenset({"x", "y"}), "states": frozenset({"FAILED"})},
    {"tags_any": frozenset({"x", "y"}), "tags_none": frozenset({"y"})},
    {"submitted_from": ev.T0 + 50, "submitted_until": ev.T0 + 150},
    {"order_field": "completedTime", "limit": 30}, {"order_field": "completedTime", "descending": False, "offset": 20},
    {"order_field": "priority", "offset": 3, "limit": 4}, {"order_field": "name", "descending": False},
    {"order_field": "state", "offset": 2, "limit": 30}, {"order_field": "username", "limit": 7},
    {"order_field": "createdTime", "descending": False, "offset": 25, "limit": 10},
]


async def _expected(engine, f: query.JobFilter, excluding: set[str]) -> tuple[int, list[str]]:
    """The list's answer computed here from every row: which jobs match, in what order."""
    async with engine.connect() as connection:
        rows = (await connection.execute(sa.select(schema.jobs).where(schema.jobs.c.submitted_at.is_not(None)))).all()
        tagged = (await connection.execute(sa.select(schema.job_tags))).all()
    tags: dict[str, set[str]] = {}
    for job, tag in tagged:
        tags.setdefault(job, set()).add(tag)
    found = [r for r in rows if r.id not in excluding
             and (f.user is None or r.user == f.user) and (f.vc is None or r.vc == f.vc)
             and (not f.states or r.state in f.states) and (not f.keyword or f.keyword.lower() in r.id.lower())
             and (not f.tags_any or f.tags_any & tags.get(r.id, set()))
             and not (f.tags_none & tags.get(r.id, set()))
             and (f.submitted_from is None or r.submitted_at >= f.submitted_from)
             and (f.submitted_until is None or r.submitted_at < f.submitted_until)]
    field = _ROW_FIELDS[f.order_field]
    present = sorted((r for r in found if getattr(r, field) is not None), key=lambda r: (getattr(r, field), r.id),
                     reverse=f.descending)
    missing = sorted((r for r in found if getattr(r, field) is None), key=lambda r: r.id)
    return len(found), [r.id for r in present + missing][f.offset:f.offset + f.limit]


async def _lists_agree(engine) -> None:
    for case in _LIST_CASES:
        f = query.JobFilter(**({"limit": 12} | case))
        for excluding in (set(), {"bob~job04", "carol~job05", "nobody~x"}):
            total, rows = await query.list_jobs(engine, f, excluding=excluding)
            assert (total, [r["debugId"] for r in rows]) == await _expected(engine, f, excluding), (case, excluding)


async def test_the_list_indexes_and_counts_added_to_a_populated_database_answer_as_the_rows_do(engine, monkeypatch):
    """A history written at revision 3, upgraded to 0004 (an index per list order; on SQLite
    the per-(user, vc, state) counts and the keyword trigram index, both filled in from the
    rows there and kept by triggers) and then to 0005 (on SQLite the per-(tag, user, vc,
    state) counts; the trigram index of submitted jobs only): every filter's total and
    page is what the rows say, right after the upgrade and after new jobs, state
    changes, a state event before its job's submission (a placeholder, not listed, then
    listed; tagged before it is), tags added, changed and removed, and deletions of
    tagged jobs (by the projection and of an archived job)."""
    await store.migrate(engine, "0003")
    events = []
    for i in range(30):
        user = ("alice", "bob", "carol")[i % 3]
        events += ev.lifecycle(f"{user}~job{i:02d}", at=ev.T0 + i * 10, exit_code=int(i % 4 == 0),
                               vc="vc1" if i % 2 else "default")
    await _apply(engine, _numbered(events))
    await store.set_tags(engine, "bob~job01", ["x", "y"])
    await store.set_tags(engine, "alice~job03", ["y"])
    await store.migrate(engine, "0004")
    seq = len(events)
    # A placeholder at 0004 (its id in the trigram index), tagged before its submission.
    await _apply(engine, _numbered([ev.state("frank~early", JobState.RUNNING, at=ev.T0 + 398, vc="vc1")], seq + 1))
    await store.set_tags(engine, "frank~early", ["x"])
    await store.set_tags(engine, "bob~job07", ["x"])
    await store.migrate(engine)
    assert await store.current_revision(engine) == "0005"
    await _lists_agree(engine)

    more = [ev.submitted("dave~new1", at=ev.T0 + 400, vc="vc1"),
            ev.state("dave~new1", JobState.RUNNING, at=ev.T0 + 401, previous=JobState.WAITING, vc="vc1"),
            ev.state("erin~early", JobState.RUNNING, at=ev.T0 + 402, vc="vc1"),  # before its submission
            ev.deleted("alice~job00", submitted_at=ev.T0),
            ev.deleted("alice~job03", submitted_at=ev.T0 + 30),  # tagged y
            ev.state("carol~job02", JobState.RUNNING, attempt=2, at=ev.T0 + 403, vc="default")]  # a retry
    await _apply(engine, _numbered(more, seq + 2))
    await store.set_tags(engine, "carol~job05", ["x"])
    await store.set_tags(engine, "bob~job01", ["y"])  # x removed
    await store.set_tags(engine, "erin~early", ["x", "y"])
    await _lists_agree(engine)
    assert (await query.list_jobs(engine, query.JobFilter(keyword="erin")))[0] == 0  # a placeholder: not listed
    await _apply(engine, _numbered([ev.submitted("erin~early", at=ev.T0 + 399, vc="vc1"),
                                    ev.submitted("frank~early", at=ev.T0 + 397, vc="vc1"),
                                    ev.state("bob~job07", JobState.RUNNING, attempt=2, at=ev.T0 + 404, vc="vc1")],
                                   seq + 10))
    await _lists_agree(engine)
    assert (await query.list_jobs(engine, query.JobFilter(keyword="erin", states=frozenset({"RUNNING"}))))[0] == 1
    assert (await query.list_jobs(engine, query.JobFilter(tags_any=frozenset({"x"}))))[0] == 4
    assert await store.delete_job(engine, "bob~job07", ev.T0 + 70)  # an archived job deleted, tagged x
    assert await store.replace_tags(engine, "carol~job05", '["x"]', ["z"])
    await _lists_agree(engine)
    assert (await query.list_jobs(engine, query.JobFilter(tags_any=frozenset({"x"}))))[0] == 2
    # A keyword's count stops at its cap: the total is then a lower bound and says so.
    cap = 4
    monkeypatch.setattr(query, "KEYWORD_TOTAL_MAX", cap)
    for f, excluding, capped in ((query.JobFilter(keyword="job", limit=3), set(), True),
                                 (query.JobFilter(keyword="~JOB", vc="vc1"), {"bob~job01", "nobody~x"}, True),
                                 (query.JobFilter(keyword="~job2", tags_none=frozenset({"x"})), {"carol~job20"}, True),
                                 (query.JobFilter(keyword="job2", user="bob"), set(), False)):
        total, rows, _ = await query.list_page(engine, f, excluding=excluding)
        matching, _ = await _expected(engine, f, set())
        exact, expected_ids = await _expected(engine, f, excluding)
        assert (matching >= cap) == capped and total.capped == capped, f
        assert total.n == min(matching, cap) - (matching - exact) and total.n <= exact, f
        assert [r["debugId"] for r in rows] == expected_ids, f


async def test_sqlite_lists_walk_an_index_in_each_order_and_total_without_counting_every_job(tmp_path):
    """At a million jobs a sort of every row or a count over every row is seconds: each
    order's page walks an index (no sort of all rows), the total of the unfiltered,
    user, VC and state lists is read from job_counts, of one tag (or without some) from
    tag_counts, of a keyword from the trigram index alone (no count over jobs), and a
    keyword that most rows hold walks the order. Checked on the plans SQLite makes for
    the statements the list runs, and on the statements."""
    engine = await store.open_store(store.dsn_for("", tmp_path))
    statements: list[tuple[str, Any]] = []
    sa.event.listen(engine.sync_engine, "before_cursor_execute",
                    lambda _c, _cur, statement, parameters, _ctx, _many: statements.append((statement, parameters)))
    try:
        await _apply(engine, _numbered(ev.lifecycle("alice~a", vc="vc1") + ev.lifecycle("bob~b", exit_code=2)))
        for field in query.ORDER_COLUMNS:
            for descending in (True, False):
                statements.clear()
                await query.list_jobs(engine, query.JobFilter(order_field=field, descending=descending, limit=1))
                async with engine.connect() as connection:
                    for statement, parameters in list(statements):
                        plan = (await connection.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)).all()
                        assert not [p for p in plan if "TEMP B-TREE" in p[-1] or p[-1] == "SCAN jobs"], (field, plan)
        for f in (query.JobFilter(), query.JobFilter(user="bob"), query.JobFilter(vc="vc1"),
                  query.JobFilter(states=frozenset({"FAILED"}), user="bob", vc="default")):
            statements.clear()
            total, _ = await query.list_jobs(engine, f, excluding={"alice~a"})
            assert total == (0 if f.vc == "vc1" else 1)
            assert not [s for s, _ in statements if "count(" in s.lower() and "FROM jobs" in s], statements
        # One tag's total (with user, VC and state, or the jobs without some tags) is read
        # from tag_counts, a keyword's alone from the trigram index: no count over jobs or tags.
        await store.set_tags(engine, "bob~b", ["x"])
        for f, expected in ((query.JobFilter(tags_any=frozenset({"x"})), 1),
                            (query.JobFilter(tags_any=frozenset({"x"}), user="bob", states=frozenset({"FAILED"})), 1),
                            (query.JobFilter(tags_none=frozenset({"x"}), vc="vc1"), 1),
                            (query.JobFilter(keyword="bob~"), 1), (query.JobFilter(keyword="nobody"), 0)):
            statements.clear()
            assert (await query.list_jobs(engine, f))[0] == expected, f
            assert not [s for s, _ in statements if "count(" in s.lower() and ("FROM jobs" in s or "FROM job_tags" in s)
                        and "job_keywords" not in s.split("WHERE")[0]], (f, statements)
        # The jobs rest lays over a page are left out of its walk only where the history has
        # them matching the filter (most are too new for it): no test of each row against the rest.
        for excluding, tested in (({"carol~new", "bob~b"}, False), ({"carol~new", "alice~a"}, True)):
            statements.clear()
            total, rows = await query.list_jobs(engine, query.JobFilter(vc="vc1"), excluding=excluding)
            assert (total, len(rows)) == ((0, 0) if tested else (1, 1))
            page = [s for s, _ in statements if s.lstrip().startswith("SELECT jobs.id, jobs.name")]
            assert len(page) == 1 and ("NOT IN" in page[0]) == tested, page
        # A keyword page walks the list's order testing each id when matches are many for
        # the rows it reads, and looks up the matches the total read when they are few.
        for offset, walks in ((0, True), (100, False)):
            statements.clear()
            await query.list_jobs(engine, query.JobFilter(keyword="bob~", offset=offset, limit=1))
            page = [s for s, _ in statements if s.lstrip().startswith("SELECT jobs.id, jobs.name")]
            assert len(page) == 1 and ("LIKE" in page[0]) == walks and "MATCH" not in page[0], page
            assert sum("MATCH" in s for s, _ in statements) == 1, statements  # its matches read once
    finally:
        await engine.dispose()


async def test_a_job_committed_between_the_left_out_check_and_the_walk_is_not_listed_twice(engine, monkeypatch):
    # rest lays its own row of a job just submitted over the page and leaves the
    # database's out; the projection may commit that job while the page is read.
    await _migrated(engine)
    await _apply(engine, _numbered(ev.lifecycle("alice~old", at=ev.T0)))
    left_out_check = query._left_out_matching

    async def projection_commits_meanwhile(connection, f, excluding):
        found = await left_out_check(connection, f, excluding)
        await _apply(engine, _numbered(ev.lifecycle("alice~new", at=ev.T0 + 10), start=100))
        return found

    monkeypatch.setattr(query, "_left_out_matching", projection_commits_meanwhile)
    total, rows = await query.list_jobs(engine, query.JobFilter(), excluding={"alice~new"})
    assert [r["debugId"] for r in rows] == ["alice~old"]  # the new one is rest's to show, once
    assert total == 1
