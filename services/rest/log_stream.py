"""A task's log as an HTTP answer, however long: read from the launcher in chunks
that each fit one NATS message (libs/common/logs.py) and streamed as they come."""

from __future__ import annotations

from aiohttp import web

from libs.common.logs import LogRequest, read_log_chunks


async def log_response(request: web.Request, bus, req: LogRequest) -> web.StreamResponse:
    """200 with the log from `req.offset` to its end (its last `tailBytes` with it).
    A log that does not exist is the launcher's NotFound, raised before the answer
    begins; a log of one chunk is a plain answer with its length."""
    chunks = read_log_chunks(bus, req)
    try:
        first = await anext(chunks, b"")
        second = await anext(chunks, None)
        if second is None:
            return web.Response(body=first, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        await response.prepare(request)
        await response.write(first)
        await response.write(second)
        async for chunk in chunks:
            # Started: a failure now can only cut the answer short (the client sees no clean end).
            await response.write(chunk)
        await response.write_eof()
        return response
    finally:
        await chunks.aclose()
