"""`/api/v2/jobs/{job}/tensorboard/...`: the job's TensorBoard, through rest.

The tensorboard plugin (libs/common/protocol/tensorboard.py) runs TensorBoard in the
first task of a role; rest relays each request to it over the bus by way of the
launcher (libs/common/tensorboard_relay.py), so the browser needs no route to the node
and rest opens no connection to one.

Who may open it: the job's owner alone (403 for anyone else, admins included). The
pages are served on PAI's own address, as the portal is, and the TensorBoard that
answers is the job's: in a container the image's own program, which a job's owner
chooses. A page of it opened by another user would run in that user's signed-in
portal origin; opened by its owner, it can do nothing they could not already do.

A browser opening the page in a tab has no bearer header to send: the portal sets the
owner's token as the cookie COOKIE, scoped to this job's TensorBoard path and
SameSite=Strict, which rest's authentication takes on these paths only
(services/rest/auth.py).
"""

from __future__ import annotations

import uuid

from aiohttp import web

from libs.common import tensorboard_relay
from libs.common.errors import Conflict, Forbidden, NotFound, TooLarge, Transient
from libs.common.protocol import tensorboard
from libs.common.tensorboard_relay import MAX_REQUEST_BODY_BYTES, RelayRequest
from services.rest import jobs_api
from services.rest.request import USER, ctx_of

# Headers added to every relayed answer: no sniffing, no framing, nothing of the path leaks elsewhere;
# its coding follows the request's Accept-Encoding (libs/common/tensorboard_relay.py).
ANSWER_HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY",
                  "Vary": "Accept-Encoding"}


async def get_tensorboard(request: web.Request) -> web.StreamResponse:
    """Any method TensorBoard's pages use (GET, HEAD, POST) under the job's TensorBoard."""
    jid = jobs_api.job_param(request)
    sub, _, _ = await jobs_api.read_job(request, jid)
    if request[USER].username != sub.user:
        raise Forbidden(f"only {sub.user} may open the TensorBoard of {jid} (it is served on PAI's own address, "
                        "so it is for its owner's browser alone)")
    role = tensorboard.serving_task(sub.spec)
    if role is None:
        raise NotFound(f"{jid} runs no TensorBoard: a job asks for one with the tensorboard runtime plugin "
                       "(extras.com.microsoft.pai.runtimeplugin: [{plugin: tensorboard}])")
    if "tail" not in request.match_info:  # TensorBoard's pages use relative addresses: under the slash
        raise web.HTTPFound(request.path + "/" + (f"?{request.query_string}" if request.query_string else ""))
    if request.content_length is not None and request.content_length > MAX_REQUEST_BODY_BYTES:
        raise TooLarge(f"a request to TensorBoard carries at most {MAX_REQUEST_BODY_BYTES} bytes")
    body = await request.content.read(MAX_REQUEST_BODY_BYTES + 1)
    if len(body) > MAX_REQUEST_BODY_BYTES:
        raise TooLarge(f"a request to TensorBoard carries at most {MAX_REQUEST_BODY_BYTES} bytes")
    relayed = RelayRequest(job=jid, role=role, fetch=uuid.uuid4().hex, method=request.method,
                           path="/" + request.match_info["tail"], query=request.query_string,
                           contentType=request.headers.get("Content-Type", ""), body=body,
                           acceptEncoding=request.headers.get("Accept-Encoding", ""))
    bus = ctx_of(request).bus
    first = await tensorboard_relay.ask(bus, relayed)
    if first.error:
        raise {404: NotFound, 409: Conflict}.get(first.status, Transient)(first.error)
    headers = {**first.headers, **ANSWER_HEADERS}
    if headers.get("Location", "").startswith("/"):  # TensorBoard's root is the job's TensorBoard path
        headers["Location"] = f"{request.path[:len(request.path) - len(relayed.path)]}{headers['Location']}"
    response = web.StreamResponse(status=first.status, headers=headers)
    response.content_length = first.size
    await response.prepare(request)
    if request.method != "HEAD":
        await response.write(first.data)
        async for chunk in tensorboard_relay.rest_of_body(bus, relayed, first):
            await response.write(chunk)
    await response.write_eof()
    return response
