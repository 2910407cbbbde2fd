"""Node health as stored in `pai_node_health`: written by the monitor, read by rest.

The cluster monitor decides each node's health (services/monitor/core/nodes.py)
and keeps the outcome here, one record per node under `node_key(node)`, so a
restarted monitor carries on where it stopped and `GET /api/v2/cluster/nodes`
shows health, conditions and cordons without asking the monitor.

Schema evolution: new fields get defaults; no field changes type.
"""

from __future__ import annotations

import re

import msgspec


class NodeHealthRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One node's health as last decided."""

    node: str
    healthy: bool = True
    conditions: list[str] = []  # libs.common.messages.NodeCondition values
    reason: str = ""
    since: float = 0.0  # when it became what it is
    heard: bool = False  # an agent sampled it at least once
    lastHeard: float = 0.0  # the monitor's clock; 0 when never
    cordoned: bool = False
    cordonReason: str = ""
    cordonedBy: str = ""


_KV_KEY_FORBIDDEN = re.compile(r"[^-/_=.a-zA-Z0-9]")


def node_key(node: str) -> str:
    """The `pai_nodes` / `pai_node_health` key of a node: its name with characters KV keys refuse replaced."""
    key = _KV_KEY_FORBIDDEN.sub("_", node).strip(".")
    return key or "_"


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(NodeHealthRecord)


def encode_health(record: NodeHealthRecord) -> bytes:
    return _encoder.encode(record)


def decode_health(data: bytes) -> NodeHealthRecord:
    """Raises msgspec.ValidationError/DecodeError on a value that is not a record."""
    return _decoder.decode(data)
