"""Node health core: samples, cordons and the clock in, NodeStatus decisions out."""

from __future__ import annotations

import msgspec
import pytest

from libs.common.messages import NodeCondition
from services.monitor.core.nodes import (
    Cordon,
    HealthSettings,
    Heard,
    NodeConditionCounts,
    NodeHealthCore,
    NodeHealthRecord,
    SaveHealth,
    StatusChanged,
    Tick,
    decode_health,
    encode_health,
)
from services.monitor.core.samples import GpuSample, NodeSample
from services.monitor.core.updates import NodeUp

GIB = 1024**3
SETTINGS = HealthSettings(lost_after_seconds=30.0, disk_full_percent=95.0, memory_full_percent=98.0)


def sample(node: str = "n1", *, disk: float = 50.0, memory: float = 50.0, ecc_double: int | None = None) -> NodeSample:
    gpus = []
    if ecc_double is not None:
        gpus = [GpuSample(index=0, uuid="GPU-0", minorNumber=0, eccErrors={"volatile_double": ecc_double, "volatile_single": 4})]
    return NodeSample(
        node=node,
        at=0.0,
        diskPath="/data",
        diskUsedBytes=int(disk * GIB),
        diskTotalBytes=100 * GIB,
        memoryUsedBytes=int(memory * GIB),
        memoryTotalBytes=100 * GIB,
        gpus=gpus,
    )


def statuses(outputs) -> list[StatusChanged]:
    return [o for o in outputs if isinstance(o, StatusChanged)]


def heard(node="n1", at=0.0, **kw) -> Heard:
    return Heard(sample=sample(node, **kw), at=at)


# Each row: the inputs in order, then the (healthy, conditions) of every NodeStatus they publish.
CASES = {
    "first sample announces a healthy node": ([heard(at=1)], [(True, [])]),
    "samples of a healthy node publish nothing more": ([heard(at=1), heard(at=6), heard(at=11)], [(True, [])]),
    "silent for the limit exactly is not lost": ([heard(at=0), Tick(now=30.0)], [(True, [])]),
    "silent past the limit is lost": ([heard(at=0), Tick(now=30.5)], [(True, []), (False, ["lost"])]),
    "lost is published once": ([heard(at=0), Tick(now=31), Tick(now=32), Tick(now=90)], [(True, []), (False, ["lost"])]),
    "a lost node heard again is healthy by itself": (
        [heard(at=0), Tick(now=31), heard(at=40)],
        [(True, []), (False, ["lost"]), (True, [])],
    ),
    "a node never heard is never lost": ([Tick(now=1000)], []),
    "silence while the monitor could not listen (NATS away) is no evidence": (
        [heard(at=0), Tick(now=50, listeningSince=45)],
        [(True, [])],
    ),
    "silent past the limit after the monitor listens again is lost": (
        [heard(at=0), Tick(now=50, listeningSince=45), Tick(now=75.5, listeningSince=45)],
        [(True, []), (False, ["lost"])],
    ),
    "double-bit ECC error": ([heard(at=0, ecc_double=0), heard(at=5, ecc_double=2)], [(True, []), (False, ["gpu_ecc_error"])]),
    "ECC counter cleared (driver reload) recovers": (
        [heard(at=0, ecc_double=1), heard(at=5, ecc_double=0)],
        [(False, ["gpu_ecc_error"]), (True, [])],
    ),
    "single-bit errors alone are healthy": ([heard(at=0, ecc_double=0)], [(True, [])]),
    "disk nearly full": ([heard(at=0, disk=96)], [(False, ["disk_pressure"])]),
    "disk just under the limit": ([heard(at=0, disk=94.9)], [(True, [])]),
    "disk freed recovers": ([heard(at=0, disk=99), heard(at=5, disk=60)], [(False, ["disk_pressure"]), (True, [])]),
    "memory nearly full": ([heard(at=0, memory=99)], [(False, ["memory_pressure"])]),
    "two conditions, then one clears: still unhealthy, published again": (
        [heard(at=0, disk=99, ecc_double=1), heard(at=5, disk=10, ecc_double=1)],
        [(False, ["gpu_ecc_error", "disk_pressure"]), (False, ["gpu_ecc_error"])],
    ),
    "the disk percent moving on publishes nothing": ([heard(at=0, disk=96), heard(at=5, disk=97)], [(False, ["disk_pressure"])]),
    "cordon makes a healthy node unhealthy": (
        [heard(at=0), Cordon(node="n1", cordoned=True, reason="swap GPU 3", by="admin", at=2)],
        [(True, []), (False, ["cordoned"])],
    ),
    "uncordon makes it healthy again": (
        [
            heard(at=0),
            Cordon(node="n1", cordoned=True, reason="r", by="admin", at=2),
            Cordon(node="n1", cordoned=False, reason="", by="admin", at=3),
        ],
        [(True, []), (False, ["cordoned"]), (True, [])],
    ),
    "a cordoned node that is lost has both": (
        [heard(at=0), Cordon(node="n1", cordoned=True, reason="r", by="a", at=1), Tick(now=40)],
        [(True, []), (False, ["cordoned"]), (False, ["lost", "cordoned"])],
    ),
    "a node may be cordoned before any agent is heard": (
        [Cordon(node="n9", cordoned=True, reason="not yet racked", by="a", at=1)],
        [(False, ["cordoned"])],
    ),
    "cordon twice publishes once": (
        [heard(at=0), Cordon(node="n1", cordoned=True, reason="a", by="x", at=1),
         Cordon(node="n1", cordoned=True, reason="b", by="x", at=2)],
        [(True, []), (False, ["cordoned"])],
    ),
}


@pytest.mark.parametrize("inputs, expected", list(CASES.values()), ids=list(CASES))
def test_node_health_table(inputs, expected):
    core = NodeHealthCore(SETTINGS)
    published = []
    for event in inputs:
        published += [(s.healthy, s.conditions) for s in statuses(core.handle(event))]
        core.validate_state()
    assert published == expected


def test_reasons_say_what_and_how_much():
    core = NodeHealthCore(SETTINGS)
    core.handle(heard(at=0, disk=97, ecc_double=3))
    reason = core.record("n1").reason
    assert "GPU 0 (3 uncorrectable)" in reason and "/data 97.0% full (limit 95%)" in reason
    lost = statuses(core.handle(Tick(now=45)))[0]
    assert lost.reason.startswith("lost: no sample from its agent for 45 s (limit 30 s)")
    cordoned = statuses(core.handle(Cordon(node="n2", cordoned=True, reason="bad fan", by="alice", at=1)))[0]
    assert cordoned.reason == "cordoned by alice: bad fan"


def test_status_ids_are_deterministic_and_distinct_per_change():
    core = NodeHealthCore(SETTINGS)
    first = statuses(core.handle(heard(at=1.5)))[0]
    lost = statuses(core.handle(Tick(now=40)))[0]
    assert first.status_id == "node/n1/healthy/1500"
    assert lost.status_id == "node/n1/unhealthy/40000"


def test_changes_are_saved_and_counted_by_openpai_labels():
    core = NodeHealthCore(SETTINGS)
    core.handle(heard("a", at=0))
    outputs = core.handle(heard("b", at=0, disk=99))
    assert any(isinstance(o, SaveHealth) and o.record.node == "b" for o in outputs)
    assert NodeUp(node="b", up=False) in outputs
    counts = [o for o in outputs if isinstance(o, NodeConditionCounts)][-1].counts
    assert counts == {("true", "false", "false", "false"): 1, ("true", "true", "false", "false"): 1}
    counts = [o for o in core.handle(Tick(now=31)) if isinstance(o, NodeConditionCounts)][-1].counts
    # Both lost now (a lost node is judged lost only: its last sample is stale);
    # the label sets seen before stay, at 0, so their series drop to 0.
    assert counts == {
        ("false", "false", "false", "false"): 2,
        ("true", "false", "false", "false"): 0,
        ("true", "true", "false", "false"): 0,
    }


def test_no_save_while_nothing_changes():
    core = NodeHealthCore(SETTINGS)
    core.handle(heard(at=0))
    assert core.handle(heard(at=5)) == []
    core.handle(Tick(now=31))
    assert core.handle(Tick(now=32)) == []


def test_restore_gives_every_node_a_full_grace_period_and_keeps_cordons():
    core = NodeHealthCore(SETTINGS)
    core.handle(heard("a", at=0))
    core.handle(Cordon(node="a", cordoned=True, reason="r", by="x", at=1))
    stored = [decode_health(encode_health(r)) for r in core.records()]

    restarted = NodeHealthCore(SETTINGS)
    outputs = restarted.restore(stored, now=1000.0)
    assert NodeUp(node="a", up=False) in outputs
    assert restarted.handle(Tick(now=1029)) == []  # silent since long before, but the monitor was away
    lost = statuses(restarted.handle(Tick(now=1031)))
    assert [(s.healthy, s.conditions) for s in lost] == [(False, ["lost", "cordoned"])]
    back = statuses(restarted.handle(heard("a", at=1040)))
    assert [(s.healthy, s.conditions) for s in back] == [(False, ["cordoned"])]
    restarted.validate_state()


def test_restored_ecc_condition_holds_until_a_new_sample():
    core = NodeHealthCore(SETTINGS)
    core.handle(heard("a", at=0, ecc_double=1))
    restarted = NodeHealthCore(SETTINGS)
    restarted.restore(core.records(), now=100)
    assert statuses(restarted.handle(Cordon(node="a", cordoned=True, reason="r", by="x", at=101)))[0].conditions == [
        str(NodeCondition.GPU_ECC_ERROR),
        str(NodeCondition.CORDONED),
    ]
    assert statuses(restarted.handle(heard("a", at=102, ecc_double=0)))[0].conditions == ["cordoned"]


def test_a_stored_record_that_is_not_json_is_refused():
    with pytest.raises(msgspec.DecodeError):
        decode_health(b"{not json")
    assert decode_health(encode_health(NodeHealthRecord(node="x"))).node == "x"
