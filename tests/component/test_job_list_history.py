"""The job list from the history database (SQLite, no NATS): the same rows, order and
totals as the live index for the same jobs, whatever the filter, with all of them
settled in the database or with some newer in the index (laid over the page)."""

from __future__ import annotations

import msgspec
import pytest

from libs.common import ids
from libs.common.messages import JobState
from services.rest import jobs_api
from services.rest.history import projection, query as history_query, store
from services.rest.job_index import JobIndex, ScheduleBrief, StatusBrief
from services.rest.records import SubmittedJob
from tests.fixtures import history_events as ev

USERS = ("ann", "bob", "cy")
VCS = ("default", "vision")
FINAL = (JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED)
N = 60


def _plan(i: int) -> dict:
    """Job i: who, where, when, its state and tags (varied so every filter and order splits them)."""
    state = [JobState.WAITING, JobState.RUNNING, *FINAL][i % 5]
    return {"job": f"{USERS[i % 3]}~job{i:03d}{'x' if i % 7 == 0 else ''}", "vc": VCS[(i // 2) % 2],
            "at": ev.T0 + (i * 37) % N + (i % 4) * 0.25, "state": state, "attempt": 1 + (i % 3 == 0),
            "tags": [["gold"], [], ["gold", "old"], ["new"]][i % 4]}


def _index_and_events(plans: list[dict]) -> tuple[JobIndex, list]:
    index = JobIndex()
    events = []
    for p in plans:
        jid, at, state, attempt = p["job"], p["at"], p["state"], p["attempt"]
        user, name = ids.split_job_id(jid)
        spec = ev.spec(jid, vc=p["vc"])
        sub = SubmittedJob(job=jid, user=user, name=name, vc=p["vc"], spec=spec, config={}, submittedAt=at,
                           tags=p["tags"])
        key = ids.job_key(jid)
        index.put_submission(key, msgspec.json.encode(sub))
        events.append(ev.submitted(jid, at=at, vc=p["vc"]))
        if state == JobState.WAITING:
            index.put_schedule(key, ScheduleBrief(reason="no free cpu cells"))
            events.append(ev.waiting(jid, "no free cpu cells", at=at + 0.5))
            continue
        final = state in FINAL
        code = {JobState.SUCCEEDED: 0, JobState.FAILED: 3}.get(state) if final else None
        index.put_schedule(key, ScheduleBrief(attempt=attempt, placed=True))
        index.put_status(key, StatusBrief(state=state, retries=attempt - 1, attempt=attempt,
                                          completedTime=at + 4 if final else None, appExitCode=code))
        events.append(ev.state(jid, JobState.RUNNING, attempt=attempt, at=at + 1, previous=JobState.WAITING,
                               vc=p["vc"]))
        if final:
            events.append(ev.state(jid, state, attempt=attempt, at=at + 4, previous=JobState.RUNNING,
                                   exit_code=code, vc=p["vc"]))
    index.ready = True
    return index, events


@pytest.fixture
async def engine(tmp_path):
    engine = await store.open_store(store.dsn_for("", tmp_path))
    yield engine
    await engine.dispose()


async def _project(engine, events: list, plans: list[dict]) -> None:
    batch = list(enumerate(events, start=1))
    await store.apply_batch(engine, projection.project_batch(batch), len(batch), len(batch))
    for p in plans:
        if p["tags"]:
            await store.set_tags(engine, p["job"], p["tags"])


QUERIES = [
    {}, {"order": "submissionTime,ASC"}, {"order": "name"}, {"order": "name,ASC"}, {"order": "completionTime,ASC"},
    {"order": "completionTime,DESC"}, {"order": "state"}, {"order": "username,ASC"}, {"order": "vc"},
    {"order": "retries"}, {"order": "totalGpuNumber,ASC"}, {"username": "ann"}, {"vc": "vision"},
    {"state": "succeeded,failed"}, {"state": "WAITING"}, {"keyword": "X"}, {"keyword": "BOB~"}, {"tags": "gold"},
    {"tagsContain": "old,new"}, {"tagsNotContain": "gold"}, {"offset": "7", "limit": "9"},
    {"offset": "55", "limit": "10"}, {"offset": "90"}, {"username": "bob", "state": "running", "offset": "2", "limit": "3"},
    {"vc": "default", "order": "completionTime,DESC", "offset": "5", "limit": "20"},
    {"order": "name,ASC", "offset": "11", "limit": "6"}, {"order": "completionTime,ASC", "offset": "30", "limit": "7"},
    {"order": "state", "offset": "13", "limit": "5"}, {"order": "totalGpuNumber", "offset": "9", "limit": "4"},
    {"tags": "gold", "order": "username", "offset": "4", "limit": "3"},
]


def _from_index(index: JobIndex, params: dict) -> tuple[int, list]:
    query = jobs_api.parse_list_query(params)
    total, page = jobs_api.select_jobs(query, list(jobs_api._ordered_from_index(index, query.order_field,
                                                                                 query.descending)))
    return total, msgspec.to_builtins(page)


async def _from_history(engine, index: JobIndex, params: dict) -> tuple[int, list]:
    total, page, capped = await jobs_api._list_from_history(engine, index, jobs_api.parse_list_query(params))
    assert not capped  # fewer matches than a keyword's count stops at
    return total, msgspec.to_builtins(page)


@pytest.mark.parametrize("params", QUERIES, ids=lambda q: "&".join(f"{k}={v}" for k, v in q.items()) or "all")
async def test_the_database_lists_as_the_index_does(engine, params):
    plans = [_plan(i) for i in range(N)]
    index, events = _index_and_events(plans)
    await _project(engine, events, plans)
    await jobs_api.settle_once(index, engine)
    assert not index.unsettled  # every row equal in both: nothing left to lay over
    assert await _from_history(engine, index, params) == _from_index(index, params)


@pytest.mark.parametrize("params", QUERIES, ids=lambda q: "&".join(f"{k}={v}" for k, v in q.items()) or "all")
async def test_rows_the_database_lacks_or_has_old_are_laid_over_its_page(engine, params):
    """A third of the jobs only in the index (just submitted: not projected), a third projected
    only up to RUNNING while the index has them final, one deleted by its owner."""
    plans = [_plan(i) for i in range(N)]
    index, _ = _index_and_events(plans)
    behind = [p | {"state": JobState.RUNNING} if p["state"] in FINAL and i % 3 == 1 else p
              for i, p in enumerate(plans)]
    kept = [p for i, p in enumerate(behind) if i % 3 != 0]
    _, events = _index_and_events(kept)
    await _project(engine, events, kept)
    gone = ids.job_key(plans[1]["job"])
    index.purged[gone] = 1.0
    index.delete_submission(gone)
    await jobs_api.settle_once(index, engine)
    assert len(index.unsettled) > N // 3
    assert await _from_history(engine, index, params) == _from_index(index, params)


async def test_a_keyword_total_past_its_cap_is_a_lower_bound_and_the_answer_says_so(engine, monkeypatch):
    """A keyword's count stops at KEYWORD_TOTAL_MAX matches (a keyword most ids hold would
    count them all on every page): the total is then at least the count, pages are
    still exact, and the answer says the total is capped; under the cap nothing says so."""
    plans = [_plan(i) for i in range(N)]
    index, events = _index_and_events(plans)
    await _project(engine, events, plans)
    await jobs_api.settle_once(index, engine)
    monkeypatch.setattr(history_query, "KEYWORD_TOTAL_MAX", 5)
    for params, exact in (({"keyword": "job", "limit": "4"}, N), ({"keyword": "BOB~", "offset": "3"}, N // 3),
                          ({"keyword": "job", "username": "cy", "state": "WAITING"}, 4)):
        query = jobs_api.parse_list_query(params)
        total, page, capped = await jobs_api._list_from_history(engine, index, query)
        want_total, want_page = _from_index(index, params)
        assert want_total == exact and msgspec.to_builtins(page) == want_page
        assert (total, capped) == ((5, True) if exact > 5 else (exact, False)), params
        response = jobs_api._list_response(msgspec.structs.replace(query, with_total=True), total, page, capped=capped)
        body = msgspec.json.decode(response.body)
        assert response.headers["X-Total-Count"] == str(total) and body["totalCount"] == total
        assert response.headers.get("X-Total-Count-Capped") == ("true" if capped else None)
        assert body.get("totalCountCapped") == (True if capped else None)


async def test_a_page_past_rows_laid_over_it_reads_only_its_own_rows_in_full(engine):
    """A page at an offset, with rows laid over the list, may be preceded by any of them:
    the database rows its window could hold are read as far as the order goes (id and
    the order column), and only those that land on the page in full."""
    import sqlalchemy as sa

    plans = [_plan(i) for i in range(N)]
    index, _ = _index_and_events(plans)
    kept = [p for i, p in enumerate(plans) if i % 3 != 0]
    _, events = _index_and_events(kept)
    await _project(engine, events, kept)
    await jobs_api.settle_once(index, engine)
    statements: list[tuple[str, object]] = []
    sa.event.listen(engine.sync_engine, "before_cursor_execute",
                    lambda _c, _cur, statement, parameters, _ctx, _many: statements.append((statement, parameters)))
    for params in ({"offset": "30", "limit": "5"}, {"order": "name", "offset": "25", "limit": "4"}):
        statements.clear()
        assert await _from_history(engine, index, params) == _from_index(index, params)
        wide = [(s, p) for s, p in statements if "jobs.tags" in s]
        assert len(wide) == 1 and len(wide[0][1]) <= int(params["limit"]), wide  # one id per row read in full
