"""Nodes over HTTP: anyone signed in may list them, only admins cordon and uncordon.

    GET    /api/v2/cluster/nodes                 every node: health, conditions, cordon, cells
    PUT    /api/v2/cluster/nodes/{node}/cordon   body {"reason": "..."} (required)
    DELETE /api/v2/cluster/nodes/{node}/cordon   body optional {"reason": "..."}

rest decides nothing about nodes: a cordon is published as `NodeCordonChanged`
and the cluster monitor folds it into the node's health (`NodeStatus`, which
the scheduler acts on); the list is read from the monitor's `pai_node_health`
and the scheduler's cluster view. Hence 202: the change is accepted, the
monitor applies it within a moment.

Each node of the list is shaped like a Kubernetes Node (`metadata.name`,
`spec.unschedulable` and `spec.taints`, `status.conditions` with a `Ready`
condition, `status.capacity` and `allocatable`), plus PAI's own flat fields
(`healthy`, `conditions`, `cordoned`, ...) and the node's cells from the
scheduler's cluster view (address, cell type, sku, leaf cells, pinned cell).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Literal

import msgspec
import nats.errors
import nats.js.errors
from aiohttp import web
from nats.js import api
from nats.js.kv import KeyValue

from libs.common.bus import RESTORE_ENTRY_TIMEOUT_SECONDS
from libs.common.errors import Forbidden, NotFound
from libs.common.ids import EventId, JobId, NodeName
from libs.common.messages import NodeCordonChanged
from libs.common.nodes import NodeHealthRecord, decode_health, node_key
from libs.common.schedule import CLUSTER_VCS_KEY, ClusterView
from libs.common.subjects import Bucket
from services.rest.request import USER, bad_field, ctx_of, read_json_object

MAX_REASON_LENGTH = 500
MAX_NODE_NAME_LENGTH = 253  # a DNS name, as Kubernetes node names
CORDON_TAINT = "pai/cordoned"
UNHEALTHY_TAINT = "pai/unhealthy"
GPU_RESOURCE = "nvidia.com/gpu"


# --- the shape of one node (Kubernetes' Node, and PAI's own fields) -------------------------------


class NodeMetadata(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    labels: dict[str, str] = {}


class Taint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"


class NodeSpec(msgspec.Struct, frozen=True, kw_only=True):
    unschedulable: bool  # cordoned: no new work goes there
    taints: list[Taint] = []


class NodeCondition(msgspec.Struct, frozen=True, kw_only=True):
    type: str  # "Ready", or a PAI condition (lost, gpu_error, ...) that holds
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None  # RFC 3339
    lastHeartbeatTime: str | None = None


class NodeStatus(msgspec.Struct, frozen=True, kw_only=True):
    conditions: list[NodeCondition]
    # Kubernetes quantities: cpu cores, memory as "<n>Mi", nvidia.com/gpu; summed over the node's cells.
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}


class NodeCell(msgspec.Struct, frozen=True, kw_only=True):
    """One node-level cell of the scheduler's cluster (its config's physical cells)."""

    address: str
    cellType: str
    sku: str
    leafCells: int
    pinnedCellId: str | None = None


class NodeView(msgspec.Struct, frozen=True, kw_only=True):
    """One node of GET /api/v2/cluster/nodes."""

    kind: Literal["Node"] = "Node"
    metadata: NodeMetadata
    spec: NodeSpec
    status: NodeStatus
    cells: list[NodeCell]
    # PAI's flat fields (the CLI and the portal read these):
    name: str
    inClusterConfig: bool  # declared in the scheduler's cluster
    healthy: bool
    conditions: list[str]
    reason: str
    since: float | None
    agentSeen: bool  # a node agent sampled it at least once
    cordoned: bool
    cordonReason: str
    cordonedBy: str


def _time(at: float) -> str | None:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z") if at else None


def _capacity(cells: list[NodeCell], sku_types: dict[str, dict[str, Any]]) -> dict[str, str]:
    cpu = memory = gpu = 0
    for cell in cells:
        sku = sku_types.get(cell.sku, {})
        cpu += cell.leafCells * int(sku.get("cpu", 0))
        memory += cell.leafCells * int(sku.get("memory", 0))
        gpu += cell.leafCells * int(sku.get("gpu", 0))
    if not cells:
        return {}
    return {"cpu": str(cpu), "memory": f"{memory}Mi", GPU_RESOURCE: str(gpu)}


def _cells(raw: list[dict[str, Any]]) -> list[NodeCell]:
    cells = []
    for cell in raw:
        try:
            cells.append(msgspec.convert(cell, NodeCell))
        except msgspec.ValidationError:
            continue  # the scheduler's view, written by a newer version: shown without it
    return cells


def node_view(name: str, record: NodeHealthRecord | None, cells: list[dict[str, Any]] | None,
              sku_types: dict[str, dict[str, Any]]) -> NodeView:
    """One node from the monitor's health record and the scheduler's cells (pure).
    `cells` None: the node is not in the scheduler's cluster (an agent reports it)."""
    record = record or NodeHealthRecord(node=name)
    own_cells = _cells(cells or [])
    if not record.heard and record.healthy:
        ready = NodeCondition(type="Ready", status="Unknown", reason="NoAgent",
                              message="no node agent has reported this node yet")
    else:
        ready = NodeCondition(type="Ready", status="True" if record.healthy else "False",
                              reason="Healthy" if record.healthy else "Unhealthy", message=record.reason,
                              lastTransitionTime=_time(record.since), lastHeartbeatTime=_time(record.lastHeard))
    held = [NodeCondition(type=c, status="True", message=record.reason, lastTransitionTime=_time(record.since))
            for c in record.conditions]
    taints = ([Taint(key=CORDON_TAINT, value=record.cordonReason)] if record.cordoned else []) + \
        ([Taint(key=UNHEALTHY_TAINT, value=record.reason)] if not record.healthy else [])
    capacity = _capacity(own_cells, sku_types)
    skus = sorted({c.sku for c in own_cells})
    return NodeView(
        metadata=NodeMetadata(name=name, labels={"pai/sku": ",".join(skus)} if skus else {}),
        spec=NodeSpec(unschedulable=record.cordoned, taints=taints),
        status=NodeStatus(conditions=[ready, *held], capacity=capacity,
                          allocatable=capacity if record.healthy and not record.cordoned else
                          {k: ("0Mi" if k == "memory" else "0") for k in capacity}),
        cells=own_cells,
        name=name,
        inClusterConfig=cells is not None,
        healthy=record.healthy,
        conditions=record.conditions,
        reason=record.reason,
        since=record.since or None,
        agentSeen=record.heard,
        cordoned=record.cordoned,
        cordonReason=record.cordonReason,
        cordonedBy=record.cordonedBy,
    )


# --- reading the buckets ------------------------------------------------------------------------


# Headers that make a KV message something other than a live value: a delete or purge
# (nats-py's KV-Operation) or a marker the server placed (TTL, age, removal).
_NOT_A_VALUE = ("KV-Operation", "Nats-Marker-Reason")


async def latest_values(kv: KeyValue) -> dict[str, bytes]:
    """Every live key of a bucket with its value, in one pass.

    One ordered push consumer delivering each key's last message, taken in by a
    callback that only files it: not a list of keys and a get per key (a round trip
    each), and not nats-py's KeyWatcher, whose two queue hops and timer per entry
    cost more than the read. Done when it has received as many messages (deletes
    included) as its consumer held when it began, counted from the consumer
    itself (nats-py's own end marker may come early: see `all_keys` in
    libs/common/bus.py); raises nats.errors.TimeoutError when they stop coming."""
    prefix = f"$KV.{kv._name}."
    values: dict[str, bytes] = {}
    received = 0
    expected: int | None = None
    complete = asyncio.Event()

    async def file(msg) -> None:
        nonlocal received
        received += 1
        key = msg.subject[len(prefix):]
        if msg.data and not (msg.headers and any(h in msg.headers for h in _NOT_A_VALUE)):
            values[key] = msg.data
        else:
            values.pop(key, None)
        if expected is not None and received >= expected:
            complete.set()

    subscription = await kv._js.subscribe(f"{prefix}>", stream=kv._stream, cb=file, ordered_consumer=True,
                                          deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
    try:
        info = await subscription.consumer_info()
        expected = info.num_pending + info.delivered.consumer_seq
        while received < expected:
            before = received
            try:
                await asyncio.wait_for(complete.wait(), RESTORE_ENTRY_TIMEOUT_SECONDS)
            except TimeoutError:
                if received == before:
                    raise nats.errors.TimeoutError from None
    finally:
        await subscription.unsubscribe()
    return values


async def _health_records(request: web.Request) -> dict[str, NodeHealthRecord]:
    kv = await ctx_of(request).bus.kv(Bucket.NODE_HEALTH)
    records = {}
    for value in (await latest_values(kv)).values():
        try:
            record = decode_health(value)
        except (msgspec.ValidationError, msgspec.DecodeError):
            continue  # the monitor's record, not ours to judge: left out of the list
        records[record.node] = record
    return records


async def _cluster_view(request: web.Request) -> ClusterView:
    kv = await ctx_of(request).bus.kv(Bucket.CLUSTER)
    try:
        entry = await kv.get(CLUSTER_VCS_KEY)  # the scheduler's one view: VCs and nodes
    except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
        return ClusterView()
    if not entry.value:
        return ClusterView()
    try:
        return msgspec.json.decode(entry.value, type=ClusterView)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return ClusterView()


async def _cluster_nodes(request: web.Request) -> list[str]:
    return [str(n.get("name")) for n in (await _cluster_view(request)).nodes if n.get("name")]


_encoder = msgspec.json.Encoder()


async def list_nodes(request: web.Request) -> web.Response:
    records, view = await asyncio.gather(_health_records(request), _cluster_view(request))
    cells = {str(n["name"]): list(n.get("cells") or []) for n in view.nodes if n.get("name")}
    names = sorted(set(cells) | set(records))
    nodes = [node_view(n, records.get(n), cells.get(n), view.skuTypes) for n in names]
    return web.Response(body=_encoder.encode(nodes), content_type="application/json")


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
