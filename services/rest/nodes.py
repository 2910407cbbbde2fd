"""Nodes over HTTP: anyone signed in may list them, only admins cordon and uncordon.

    GET    /api/v2/cluster/nodes                 every node: health, conditions, cordon
    PUT    /api/v2/cluster/nodes/{node}/cordon   body {"reason": "..."} (required)
    DELETE /api/v2/cluster/nodes/{node}/cordon   body optional {"reason": "..."}

rest decides nothing about nodes: a cordon is published as `NodeCordonChanged`
and the cluster monitor folds it into the node's health (`NodeStatus`, which
the scheduler acts on); the list is read from the monitor's `pai_node_health`
and the scheduler's cluster view. Hence 202: the change is accepted, the
monitor applies it within a moment.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import nats.js.errors
from aiohttp import web

from libs.common.bus import all_keys
from libs.common.errors import Forbidden, NotFound
from libs.common.ids import EventId, JobId, NodeName
from libs.common.messages import NodeCordonChanged
from libs.common.nodes import NodeHealthRecord, decode_health, node_key
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.subjects import Bucket
from services.rest.request import USER, bad_field, ctx_of, read_json_object

MAX_REASON_LENGTH = 500
MAX_NODE_NAME_LENGTH = 253  # a DNS name, as Kubernetes node names


async def _health_records(request: web.Request) -> dict[str, NodeHealthRecord]:
    kv = await ctx_of(request).bus.kv(Bucket.NODE_HEALTH)
    records: dict[str, NodeHealthRecord] = {}
    for key in await all_keys(kv):
        try:
            entry = await kv.get(key)
            record = decode_health(entry.value) if entry.value else None
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            continue
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # the monitor's record, not ours to judge: left out of the list
        if record is not None:
            records[record.node] = record
    return records


async def _cluster_nodes(request: web.Request) -> list[str]:
    kv = await ctx_of(request).bus.kv(Bucket.CLUSTER)
    try:
        entry = await kv.get(CLUSTER_VCS_KEY)  # the scheduler's one view: VCs and nodes
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return []
    if not entry.value:
        return []
    try:
        view = msgspec.json.decode(entry.value, type=ClusterView)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return []
    return [str(n.get("name")) for n in view.nodes if n.get("name")]


def node_view(name: str, record: NodeHealthRecord | None, in_cluster: bool) -> dict[str, Any]:
    record = record or NodeHealthRecord(node=name)
    return {
        "name": name,
        "inClusterConfig": in_cluster,
        "healthy": record.healthy,
        "conditions": record.conditions,
        "reason": record.reason,
        "since": record.since or None,
        "agentSeen": record.heard,
        "cordoned": record.cordoned,
        "cordonReason": record.cordonReason,
        "cordonedBy": record.cordonedBy,
    }


async def list_nodes(request: web.Request) -> web.Response:
    records = await _health_records(request)
    configured = await _cluster_nodes(request)
    names = sorted(set(configured) | set(records))
    return web.json_response([node_view(n, records.get(n), n in configured) for n in names])


def _node_param(request: web.Request) -> str:
    node = request.match_info["node"]
    if not node or len(node) > MAX_NODE_NAME_LENGTH or node_key(node) != node:
        raise bad_field("node", "name", f"{node[:60]!r} is not a node name (letters, digits, '-', '_', '.'; "
                                        f"at most {MAX_NODE_NAME_LENGTH} characters)")
    return node


async def _known_node(request: web.Request, node: str) -> None:
    configured = await _cluster_nodes(request)
    if node in configured:
        return
    records = await _health_records(request)
    if node in records:
        return
    known = ", ".join(sorted(set(configured) | set(records))[:20]) or "none yet"
    raise NotFound(f"no node {node} (known: {known})")


async def _reason(request: web.Request, *, required: bool) -> str:
    if required or request.can_read_body:
        body = await read_json_object(request, what="the body", example='{"reason": "replacing GPU 3"}')
    else:
        body = {}
    reason = body.get("reason", "")
    if not isinstance(reason, str):
        raise bad_field("reason", "type", "reason must be a string")
    reason = reason.strip()
    if required and not reason:
        raise bad_field("reason", "required", "say why the node is cordoned, e.g. {\"reason\": \"replacing GPU 3\"}")
    if len(reason) > MAX_REASON_LENGTH:
        raise bad_field("reason", "max_length", f"reason is {len(reason)} characters; the limit is {MAX_REASON_LENGTH}")
    return reason


async def _change(request: web.Request, *, cordoned: bool) -> web.Response:
    user = request[USER]
    what = "cordon" if cordoned else "uncordon"
    if not user.admin:
        raise Forbidden(f"only an admin may {what} a node")
    node = _node_param(request)
    reason = await _reason(request, required=cordoned)
    await _known_node(request, node)
    at = time.time()
    event = NodeCordonChanged(
        id=EventId(f"node/{node}/{what}/{int(at * 1000)}"),
        job=JobId(""),
        at=at,
        node=NodeName(node),
        cordoned=cordoned,
        reason=reason,
        by=user.username,
    )
    await ctx_of(request).bus.publish(event)
    return web.json_response(
        {"message": f"{what} of node {node} requested", "node": node, "cordoned": cordoned, "reason": reason},
        status=202,
    )


async def cordon(request: web.Request) -> web.Response:
    return await _change(request, cordoned=True)


async def uncordon(request: web.Request) -> web.Response:
    return await _change(request, cordoned=False)


routes = [
    web.get("/api/v2/cluster/nodes", list_nodes),
    web.put("/api/v2/cluster/nodes/{node}/cordon", cordon),
    web.delete("/api/v2/cluster/nodes/{node}/cordon", uncordon),
]
