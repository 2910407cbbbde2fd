"""The monitor's tag-job alert action, answered over the bus: `pai.rpc.v1.job_tag`
(queue group "rest", one replica answers each), the tag changed by the tag route's
own code (`jobs_api.change_tags`), so the monitor needs no API token. Only the
monitor may ask (libs/common/busauth.py); it may tag any job, as an admin may."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from libs.common import documents
from libs.common.document_messages import Outcome
from libs.common.errors import BadInput, NotFound
from libs.common.job_tags import TagReply, TagRequest
from libs.common.subjects import JOB_TAG_QUEUE, JOB_TAG_SUBJECT
from services.rest import jobs_api
from services.rest.request import CTX

log = logging.getLogger("pai.rest.tags")


def setup(app: web.Application) -> None:
    app.cleanup_ctx.append(_serving)


async def _serving(app: web.Application) -> AsyncIterator[None]:
    async def handle(request: TagRequest) -> TagReply:
        try:
            tag = jobs_api._tag_of({"value": request.tag})
            message = await jobs_api.change_tags(app, request.job, tag, jobs_api._add_tag, allow=lambda sub: None)
        except BadInput as error:
            return TagReply(outcome=Outcome.INVALID, message=error.message)
        except NotFound as error:
            return TagReply(outcome=Outcome.NOT_FOUND, message=error.message)
        log.info("%s (asked by %s)", message, request.by or "the monitor")
        return TagReply(outcome=Outcome.OK, message=message)

    answer = documents.answering(TagRequest, handle, TagReply, what="a tag", store="job store")
    subscription = await documents.subscribe(app[CTX].bus, JOB_TAG_SUBJECT, JOB_TAG_QUEUE)
    serving = asyncio.ensure_future(documents.serve(subscription, answer))
    yield
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving
