"""The JetStream bus, in layers (docs/architecture.md, "The bus"), each building on
the one before, as nats.py splits its protocol, client, JetStream and KV:

- `link`: how a connection subscribes, sends requests and settles deliveries,
  through nats-py's public API (`bus_client: plain`); `wire`, the one module
  that reads nats-py's internals, does the same with less work per message
  (`bus_client: fast`, the default); `answers`: the acks and API answers of
  the bus's requests, on one reply subscription per connection;
- `connection`: connect (jittered retries, a cluster's servers), the link, the
  bootstrap of the event stream and every bucket, opening buckets, closing;
- `publish`: deduplicated publishes and KV writes, their acks awaited together;
- `pull` and `consume`: the bus's own pull requests, and durable consumers
  under PAI's ack rules (batches, ordered consumers, dead letters);
- `kv`: reading keys and whole buckets in pages from a store that is ready, and
  KV watches that stand again after every reconnect (`keep_watching`, `watch_key`).

`Bus` is all of them on one connection; the names below are what callers use.
"""

from __future__ import annotations

from libs.common.bus.answers import (
    STORED,
    ApiAnswer,
    PendingStores,
    StoreAcks,
    api_answer_of,
    pub_ack_of,
    revision_of,
    store_outcome,
)
from libs.common.bus.connection import (
    DRAIN_SECONDS,
    MAX_OUTSTANDING_PINGS,
    PING_INTERVAL_SECONDS,
    STORE_READY_SECONDS,
    Connection,
    default_client,
    server_urls,
)
from libs.common.bus.consume import (
    ACK_WAIT_SECONDS,
    BATCH_MAX,
    DEAD_LETTER_AFTER,
    HANDLER_DEADLINE_SECONDS,
    MAX_DELIVER,
    STALLED_DEAD_LETTER_AFTER,
    TRANSIENT_DEAD_LETTER_AFTER,
    BatchHandler,
    Consumer,
    Handler,
    HandlerStalled,
    kept_in_progress,
)
from libs.common.bus.kv import (
    RESTORE_ENTRY_TIMEOUT_SECONDS,
    RESTORE_PAGE_ENTRIES,
    RESTORE_TIMEOUT_SECONDS,
    KvEntry,
    all_keys,
    connection_number,
    get_json,
    get_many,
    keep_watching,
    load_all,
    read_pages,
    stored_when_watch_began,
    watch_key,
)
from libs.common.bus.link import BUS_CLIENTS, BusClient, DirectSubscription, Link, Received, ack_all, link_of
from libs.common.bus.publish import (
    KV_DELETE,
    KV_OPERATION,
    KV_TTL_HEADER,
    PUBLISH_ACK_SECONDS,
    PUBLISH_TROUBLE,
    STORE_FULL_ERR_CODES,
    Publisher,
    purge_marker,
    store_is_full,
)
from libs.common.bus.pull import Puller, delivery
from libs.common.subjects import STREAM


class Bus(Consumer):
    """One NATS connection with its link, its JetStream context and opened KV
    buckets: connect and bootstrap (`Connection`), publish (`Publisher`), consume
    (`Consumer`)."""


__all__ = [
    "ACK_WAIT_SECONDS", "BATCH_MAX", "BUS_CLIENTS", "DEAD_LETTER_AFTER", "DRAIN_SECONDS", "HANDLER_DEADLINE_SECONDS",
    "KV_DELETE", "KV_OPERATION", "KV_TTL_HEADER", "MAX_DELIVER", "MAX_OUTSTANDING_PINGS", "PING_INTERVAL_SECONDS",
    "PUBLISH_ACK_SECONDS", "PUBLISH_TROUBLE", "RESTORE_ENTRY_TIMEOUT_SECONDS", "RESTORE_PAGE_ENTRIES",
    "RESTORE_TIMEOUT_SECONDS", "STALLED_DEAD_LETTER_AFTER", "STORED", "STORE_FULL_ERR_CODES", "STORE_READY_SECONDS",
    "STREAM", "TRANSIENT_DEAD_LETTER_AFTER",
    "ApiAnswer", "BatchHandler", "Bus", "BusClient", "Connection", "Consumer", "DirectSubscription", "Handler",
    "HandlerStalled", "KvEntry", "Link", "PendingStores", "Publisher", "Puller", "Received", "StoreAcks",
    "ack_all", "all_keys", "api_answer_of", "default_client", "delivery", "get_json", "get_many", "kept_in_progress",
    "connection_number", "keep_watching", "link_of", "load_all", "pub_ack_of", "purge_marker", "read_pages",
    "revision_of", "server_urls", "store_is_full", "store_outcome", "stored_when_watch_began", "watch_key",
]
