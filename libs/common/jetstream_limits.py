"""The limits of PAI's JetStream store: the event stream and every KV bucket, in one
table. `Bus.bootstrap` applies them on every start (creating or updating), so a
change here or in the configuration reaches an existing store too.

Why limits at all: JetStream's defaults are unlimited, so a runaway producer (a job
resubmitted in a loop, an alert storm) would fill the disk NATS shares with every
stream, and NATS stops accepting writes for *all* of them when its disk is full.
Explicit limits make one full store refuse writes to itself, loudly, while the rest
of the platform goes on.

Discard policy: everywhere NEW. A full stream refuses the next write (the publisher
gets an error it retries, reports, or turns into a 503) instead of silently dropping
the oldest entries: an old event may still be unconsumed by a service that is down,
and an old KV entry is a job's current state. Nothing PAI stores may vanish because
something else grew.

Sizes: the largest message PAI writes is a job's normalised spec plus its status
document, which intake keeps under nats-server's default max_payload of 1 MiB
(libs/common/protocol/limits.py; tests/unit/test_intake_limits.py checks the largest
job allowed). A message larger than that is a bug, refused by the store.

Each limit can be changed through the configuration (libs/common/config.py,
`nats_*` settings), e.g. for a cluster with far more jobs per week.
"""

from __future__ import annotations

import msgspec

from libs.common.config import Config
from libs.common.subjects import Bucket

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# nats-server's default max_payload: nothing larger can be published at all.
MAX_MESSAGE_BYTES = 1 * MIB

# A retried publish (same Nats-Msg-Id) within this window is stored once. Ten
# minutes covers a publisher that retried through a NATS restart or a cluster
# leader election (seconds) with a wide margin; longer costs server memory per id.
EVENTS_DUPLICATE_WINDOW_SECONDS = 600.0
# KV writes are deduplicated by revision (update(last=...)), not by message id;
# two minutes is the window nats-py and the nats CLI give every bucket.
KV_DUPLICATE_WINDOW_SECONDS = 120.0

# Events are the log services consume and restore from; a week lets a service be
# down over a long weekend and still find every event it has not handled.
EVENTS_MAX_AGE_SECONDS = 7 * 24 * 3600.0
# A few KiB per event: 2 GiB holds about half a million events, a week of a busy
# cluster. JetStream reserves every stream's max_bytes against the server's
# max_file_store when the stream is made, so the whole table (about 4.6 GiB, see
# `total_bytes`) must fit it: the chart gives NATS 8 GiB on a 10 GiB volume.
EVENTS_MAX_BYTES = 2 * GIB


class StoreLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of one stream (the event stream, or the stream behind a bucket)."""

    max_bytes: int
    max_message_bytes: int = MAX_MESSAGE_BYTES
    duplicate_window_seconds: float = KV_DUPLICATE_WINDOW_SECONDS
    max_age_seconds: float = 0.0  # 0: entries do not expire


EVENTS = StoreLimits(
    max_bytes=EVENTS_MAX_BYTES,
    duplicate_window_seconds=EVENTS_DUPLICATE_WINDOW_SECONDS,
    max_age_seconds=EVENTS_MAX_AGE_SECONDS,
)

# One entry per key (history 1), so a bucket's size is its number of keys times the
# size of one value; each limit is that with a wide margin. KV entries never expire:
# they are current state, removed by their owner.
BUCKETS: dict[Bucket, StoreLimits] = {
    # Every job's spec and raw config, up to 1 MiB each (typically a few KiB).
    Bucket.JOBS: StoreLimits(max_bytes=1 * GIB),
    # One lifecycle document per job: attempts and tasks with exit specs.
    Bucket.JOB_STATUS: StoreLimits(max_bytes=1 * GIB),
    # Placement or waiting reason per job.
    Bucket.SCHEDULE: StoreLimits(max_bytes=256 * MIB),
    # Sealed secrets per job: small (a few values).
    Bucket.SECRETS: StoreLimits(max_bytes=128 * MIB),
    # A handful of documents each: users and token hashes, the VC and node view,
    # failure rules, node samples, the two leases.
    Bucket.USERS: StoreLimits(max_bytes=32 * MIB),
    Bucket.CLUSTER: StoreLimits(max_bytes=32 * MIB),
    Bucket.RULES: StoreLimits(max_bytes=16 * MIB),
    Bucket.NODES: StoreLimits(max_bytes=64 * MIB),
    # One health record per node (monitor): conditions and cordon.
    Bucket.NODE_HEALTH: StoreLimits(max_bytes=64 * MIB),
    Bucket.LEASES: StoreLimits(max_bytes=1 * MIB, max_message_bytes=4 * KIB),
    # A job's utilisation over time: one bounded history per task (~15 KiB, libs/common/usage_history.py);
    # its entries expire (store_settings: retention_finished_seconds after their last sample).
    Bucket.JOB_METRICS: StoreLimits(max_bytes=1 * GIB),
    # Marketplace items: at most MAX_MARKET_ITEMS of MAX_MARKET_ITEM_BYTES (typically a few KiB), and stars.
    Bucket.MARKET: StoreLimits(max_bytes=512 * MIB),
    # The open browser terminals: terminal_sessions_max records of under 1 KiB.
    Bucket.TERMINALS: StoreLimits(max_bytes=8 * MIB),
}
# A bucket added to `Bucket` without a line above: small state (per node or per
# service), as most buckets are. Give a bucket that grows with jobs its own line.
OTHER_BUCKET = StoreLimits(max_bytes=64 * MIB)


class StoreSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What `Bus.bootstrap` creates the store with."""

    replicas: int = 1  # copies of every stream; 3 on a three-node JetStream cluster
    events: StoreLimits = EVENTS
    buckets: dict[Bucket, StoreLimits] = msgspec.field(default_factory=lambda: dict(BUCKETS))

    def bucket(self, bucket: Bucket) -> StoreLimits:
        return self.buckets.get(bucket, OTHER_BUCKET)

    def total_bytes(self) -> int:
        """What JetStream reserves for the whole store on each server holding a copy."""
        return self.events.max_bytes + sum(self.bucket(b).max_bytes for b in Bucket)


def store_settings(config: Config) -> StoreSettings:
    """The settings from a `Config`: its `nats_*` fields override the table (0: keep)."""
    events = EVENTS
    if config.nats_events_max_bytes:
        events = msgspec.structs.replace(events, max_bytes=config.nats_events_max_bytes)
    if config.nats_events_max_age_seconds:
        events = msgspec.structs.replace(events, max_age_seconds=config.nats_events_max_age_seconds)
    if config.nats_max_message_bytes:
        events = msgspec.structs.replace(events, max_message_bytes=config.nats_max_message_bytes)
    if config.nats_events_duplicate_window_seconds:
        events = msgspec.structs.replace(events, duplicate_window_seconds=config.nats_events_duplicate_window_seconds)
    buckets = {}
    for bucket in Bucket:
        limits = BUCKETS.get(bucket, OTHER_BUCKET)
        if config.nats_bucket_max_bytes:
            limits = msgspec.structs.replace(limits, max_bytes=config.nats_bucket_max_bytes)
        # The lease keeps its own small cap: a large lease document is a bug.
        if config.nats_max_message_bytes and bucket is not Bucket.LEASES:
            limits = msgspec.structs.replace(limits, max_message_bytes=config.nats_max_message_bytes)
        if bucket is Bucket.JOB_METRICS:  # gone with the job's logs (retention_finished_seconds)
            limits = msgspec.structs.replace(limits, max_age_seconds=config.retention_finished_seconds)
        buckets[bucket] = _window_within_age(limits)
    return StoreSettings(replicas=max(1, config.nats_replicas), events=_window_within_age(events), buckets=buckets)


def _window_within_age(limits: StoreLimits) -> StoreLimits:
    """nats-server refuses a stream whose duplicate window is longer than its max age
    (e.g. job metrics kept for a test's short retention): the window is cut to the age."""
    if limits.max_age_seconds and limits.duplicate_window_seconds > limits.max_age_seconds:
        return msgspec.structs.replace(limits, duplicate_window_seconds=limits.max_age_seconds)
    return limits


def marker_seconds(config: Config) -> float:
    """How long the purge marker of a record that left a bucket stays (then nothing of
    its key is left in the bucket's stream, nor in nats-server's memory): the event
    stream's duplicate window, within which an event about the job may still come
    again and find the record gone rather than never there."""
    return store_settings(config).events.duplicate_window_seconds
