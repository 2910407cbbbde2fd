"""Per-user quotas, so that no user fills the shared store or rest for everyone else.

The job bucket, the user bucket and rest itself are shared by every user: without a
bound per user, one user's 1,124 jobs with a 950 KB `extras` filled the 1 GiB job
bucket, after which every user's submission failed. Each limit below is the
configuration's (`rest_user_max_*`, libs/common/config.py; 0: none), and each refusal
names the limit, its value, what is used and what to do:

- jobs stored per user (`rest_user_max_jobs`) and the bytes of their records
  (`rest_user_max_job_bytes`): 507 until the user deletes finished jobs (which also
  leave by themselves once the history holds them); a refusal past the first says how
  many of the user's jobs have finished, and when none has, that a queue fills it and
  only stopping jobs frees room;
- live tokens per user (`rest_user_max_tokens`, services/rest/identity/routes.py):
  a sign-in past it ends the user's oldest sign-in; a new application token is 507;
- submissions of one user being taken at once by one rest process
  (`rest_user_max_submissions_in_flight`): 429, try again when one is answered.

What a user stores is counted by rest's job index (every replica has it, fed by the
bucket's watch); while it loads, the jobs are counted by listing the user's keys and
their bytes are not checked. A replica counts the jobs it has stored at once, the
other replicas' within milliseconds, so several submissions taken together may pass a
limit by at most the submissions in flight (bounded by the last limit).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from libs.common.bus import all_keys
from libs.common.config import Config
from libs.common.errors import QuotaExceeded
from libs.common.subjects import Bucket
from services.rest.job_index import JobIndex
from services.rest.request import ctx_of

DELETE_REMEDY = "delete finished jobs you no longer need (pai delete JOB, DELETE /api/v2/jobs/{user}~{name})"
# When none of a user's stored jobs has finished, there is nothing to delete: a queue fills the quota.
UNFINISHED_REMEDY = ("none of them has finished: stop jobs you no longer need (pai stop JOB, PUT "
                     "/api/v2/jobs/{user}~{name}/executionType), or submit again once some have ended")
TOKEN_REMEDY = "revoke tokens you no longer use (GET and DELETE /api/v2/tokens, pai token list/revoke)"


class InFlight:
    """Submissions being taken per user in this process."""

    def __init__(self) -> None:
        self.by_user: dict[str, int] = {}

    @contextlib.contextmanager
    def taking(self, user: str, limit: int):
        now = self.by_user.get(user, 0)
        if limit and now >= limit:
            raise QuotaExceeded(f"{user} already has {now} submissions being taken at once (at most {limit})",
                                limit="rest_user_max_submissions_in_flight", value=limit, used=now,
                                remedy="wait for one to be answered, then submit again", status=429)
        self.by_user[user] = now + 1
        try:
            yield
        finally:
            left = self.by_user[user] - 1
            if left:
                self.by_user[user] = left
            else:
                del self.by_user[user]


IN_FLIGHT = web.AppKey("submissions_in_flight", InFlight)


def setup(app: web.Application) -> None:
    app[IN_FLIGHT] = InFlight()


@contextlib.asynccontextmanager
async def submitting(request: web.Request, user: str) -> AsyncIterator[None]:
    """Around one submission of `user`: 429 past `rest_user_max_submissions_in_flight`."""
    in_flight = request.app.get(IN_FLIGHT)
    if in_flight is None:
        yield
        return
    with in_flight.taking(user, ctx_of(request).config.rest_user_max_submissions_in_flight):
        yield


def check_stored_jobs(config: Config, user: str, jobs: int, size: int | None, new_size: int,
                      finished: int | None = None) -> None:
    """507 when one more job of `new_size` bytes would pass the user's stored-jobs
    quotas, `jobs` and `size` (None: not known) being what they store now, `finished`
    of those jobs ended (None: not known). Pure."""
    if config.rest_user_max_jobs and jobs + 1 > config.rest_user_max_jobs:
        message = f"{user} has {jobs} jobs stored, the most one user may keep"
        remedy = DELETE_REMEDY
        if finished is not None:
            message = f"{user} has {jobs} jobs stored ({finished} finished), the most one user may keep"
            if finished:
                # They also leave by themselves once the history holds them (live_finished_job_seconds).
                kept = config.live_finished_job_seconds
                after = f"{kept / 60:.0f} minutes" if kept >= 120 else f"{kept:.0f} seconds"
                remedy = f"{DELETE_REMEDY}; finished jobs also leave the count by themselves, about {after} after they end"
            else:
                remedy = UNFINISHED_REMEDY
        raise QuotaExceeded(message, limit="rest_user_max_jobs", value=config.rest_user_max_jobs, used=jobs,
                            remedy=remedy)
    limit = config.rest_user_max_job_bytes
    if limit and size is not None and size + new_size > limit:
        raise QuotaExceeded(f"{user}'s jobs take {size} bytes of the store and this one {new_size} more, "
                            f"past the {limit} bytes one user may keep",
                            limit="rest_user_max_job_bytes", value=limit, used=size, remedy=DELETE_REMEDY)


async def check_submission(request: web.Request, index: JobIndex | None, user: str, new_size: int) -> None:
    """The stored-jobs quotas of `user` before one more record of `new_size` bytes."""
    config = ctx_of(request).config
    if not (config.rest_user_max_jobs or config.rest_user_max_job_bytes):
        return
    if index is not None and index.ready:
        jobs, size = index.usage.get(user, (0, 0))
        check_stored_jobs(config, user, jobs, size, new_size, index.finished.get(user, 0))
        return
    if config.rest_user_max_jobs:  # the index is loading: count the user's keys (user.name)
        keys = await all_keys(await ctx_of(request).bus.kv(Bucket.JOBS), f"{user}.")
        check_stored_jobs(config, user, len(keys), None, new_size)


def check_tokens(config: Config, user: str, live: int) -> None:
    """507 when `user`, holding `live` tokens, may not have one more. Pure."""
    limit = config.rest_user_max_tokens
    if limit and live + 1 > limit:
        raise QuotaExceeded(f"{user} has {live} live tokens, the most one user may hold",
                            limit="rest_user_max_tokens", value=limit, used=live, remedy=TOKEN_REMEDY)
