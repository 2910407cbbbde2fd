"""Marketplace items in the KV bucket `pai_market` (rest writes it; services/rest/market/core.py decides).

Why a bucket of its own and not the history database: an item is current state that
people change (edit, share, review, star) and that every rest replica reads, like the
users and storages in `pai_users`, not a record of something that happened; the history
database is a projection of the event stream, written by its projector alone. A bucket
of its own gives the items their own size limit (libs/common/jetstream_limits.py), apart
from the users'.

Keys:
- `item.<id>`: the item (core.MarketItem), created with `create` (an id taken is a
  409) and changed at the revision read (compare-and-set; a lost race is read and
  decided again, or, with the API's If-Match, a 412);
- `star.<id>.<user>`: one user's star, created and deleted; an item's star count is
  the number of its star keys, so a crash never leaves a count that disagrees.

A job made from an item counts in the item's `submits`, added once the job is
accepted (compare-and-set). It is a statistic: a rest that dies between the job's
acceptance and that write leaves it one short; the job itself is never refused or
delayed for it.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import nats.js.errors
from nats.js.kv import KeyValue

from libs.common.bus import Bus, all_keys, get_json, read_pages
from libs.common.errors import Conflict, PaiError, QuotaExceeded
from libs.common.protocol import limits as L
from libs.common.subjects import Bucket
from services.rest.market import core
from services.rest.market.core import Caller, ItemFields, MarketItem

log = logging.getLogger("pai.rest.market")
ITEM_PREFIX = "item."
STAR_PREFIX = "star."
UPDATE_ATTEMPTS = 10
BUILTIN_DIR = Path(__file__).parent / "builtin"


class StaleItem(PaiError):
    """A change based on a revision that is no longer the item's (If-Match)."""

    status = 412
    code = "PreconditionFailed"


def item_key(item_id: str) -> str:
    return f"{ITEM_PREFIX}{item_id}"


def star_key(item_id: str, user: str) -> str:
    return f"{STAR_PREFIX}{item_id}.{user}"


async def _kv(bus: Bus) -> KeyValue:
    return await bus.kv(Bucket.MARKET)


async def get_item(bus: Bus, item_id: str) -> tuple[MarketItem, int] | None:
    core.check_item_id(item_id)
    return await get_json(await _kv(bus), item_key(item_id), MarketItem)


async def all_items(bus: Bus) -> dict[str, MarketItem]:
    """Every item, read in pages (at most MAX_MARKET_ITEMS, typically a few KiB each)."""
    items: dict[str, MarketItem] = {}
    async for page in read_pages(await _kv(bus), prefix=ITEM_PREFIX):
        for entry in page:
            items.pop(entry.key, None)
            if entry.value:
                try:
                    item = msgspec.json.decode(entry.value, type=MarketItem)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # never one bad value for all
                    log.error("marketplace: %s does not decode (%s); left out", entry.key, exc)
                    continue
                items[entry.key] = item
    return {item.id: item for item in items.values()}


async def stars(bus: Bus) -> dict[str, set[str]]:
    """Who starred each item: item id -> users."""
    starred: dict[str, set[str]] = {}
    for key in await all_keys(await _kv(bus), STAR_PREFIX):
        item_id, _, user = key.removeprefix(STAR_PREFIX).partition(".")
        starred.setdefault(item_id, set()).add(user)
    return starred


async def create(bus: Bus, caller: Caller, fields: ItemFields, *, item_id: str = "",
                 builtin: bool = False) -> tuple[MarketItem, int]:
    """A new item (its id made from its name unless given) and its revision; 409 for an id
    taken, 507 past MAX_MARKET_ITEMS_PER_USER or MAX_MARKET_ITEMS."""
    kv = await _kv(bus)
    items = await all_items(bus)
    mine = sum(1 for i in items.values() if i.owner == caller.username)
    if not builtin and mine >= L.MAX_MARKET_ITEMS_PER_USER:
        raise QuotaExceeded(f"{caller.username} owns {mine} marketplace items", limit="MAX_MARKET_ITEMS_PER_USER",
                            value=L.MAX_MARKET_ITEMS_PER_USER, used=mine, remedy="delete an item first")
    if len(items) >= L.MAX_MARKET_ITEMS:
        raise QuotaExceeded("the marketplace is full", limit="MAX_MARKET_ITEMS", value=L.MAX_MARKET_ITEMS,
                            used=len(items), remedy="an admin must delete items first")
    if item_id:
        core.check_item_id(item_id)
    else:
        item_id = core.new_item_id(fields.name, set(items), secrets.token_hex(3))
    item = core.saved(None, fields, caller, item_id=item_id, now=time.time())
    if builtin:
        item = msgspec.structs.replace(item, builtin=True)
    value = _encoded(item)
    try:
        revision = await kv.create(item_key(item_id), value)
    except nats.js.errors.KeyWrongLastSequenceError:
        raise Conflict(f"marketplace item {item_id} already exists") from None
    return item, revision


def _encoded(item: MarketItem) -> bytes:
    value = msgspec.json.encode(item)
    if len(value) > L.MAX_MARKET_ITEM_BYTES:  # the fields' own limits keep it under; a guard all the same
        raise core.bad("$", "maxSize", f"the item is {len(value)} bytes stored; the limit is {L.MAX_MARKET_ITEM_BYTES}")
    return value


async def change(bus: Bus, item_id: str, caller: Caller, plan: Callable[[MarketItem], MarketItem], *,
                 if_match: int | None = None) -> tuple[MarketItem, int]:
    """Read the item, let `plan(item) -> new item` decide (it raises to refuse), write it
    at the revision read; a lost race is read and planned again, or a 412 with If-Match.
    The item as it is then, and its revision."""
    kv = await _kv(bus)
    for _ in range(UPDATE_ATTEMPTS):
        got = await get_item(bus, item_id)
        current = core.readable(caller, got[0] if got else None, item_id)
        revision = got[1] if got else 0
        if if_match is not None and if_match != revision:
            raise StaleItem(f"item {item_id} is at revision {revision}, not {if_match}: it changed since you read it; "
                            "read it again")
        new = plan(current)
        if new == current:
            return current, revision
        try:
            return new, await kv.update(item_key(item_id), _encoded(new), last=revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            if if_match is not None:
                raise StaleItem(f"item {item_id} changed while being saved; read it again") from None
            continue
    raise Conflict(f"item {item_id} is being changed by others; try again")


async def delete(bus: Bus, item_id: str, caller: Caller) -> None:
    got = await get_item(bus, item_id)
    core.changeable(caller, got[0] if got else None, item_id)
    assert got is not None
    kv = await _kv(bus)
    try:
        await kv.delete(item_key(item_id), last=got[1])
    except nats.js.errors.KeyWrongLastSequenceError:
        raise Conflict(f"item {item_id} was changed while being deleted; try again") from None
    for key in await all_keys(kv, STAR_PREFIX):
        if key.startswith(star_key(item_id, "")):
            await kv.delete(key)


async def star(bus: Bus, item_id: str, caller: Caller, on: bool) -> None:
    got = await get_item(bus, item_id)
    core.readable(caller, got[0] if got else None, item_id)
    kv = await _kv(bus)
    key = star_key(item_id, caller.username)
    if on:
        try:
            await kv.create(key, b"1")
        except nats.js.errors.KeyWrongLastSequenceError:
            pass  # starred already: the same answer
    else:
        try:
            await kv.delete(key)
        except nats.js.errors.KeyNotFoundError:
            pass


async def count_submission(bus: Bus, caller: Caller, item_id: str) -> None:
    """One more job made from the item (one the caller may read); never fails the submission."""
    try:
        def plan(item: MarketItem) -> MarketItem:
            return msgspec.structs.replace(item, submits=item.submits + 1)

        await change(bus, item_id, caller, plan)
    except PaiError as exc:
        log.info("job from marketplace item %s by %s not counted: %s", item_id, caller.username, exc.message)
    except (TimeoutError, nats.errors.Error) as exc:
        log.warning("job from marketplace item %s not counted (the bus did not answer): %r", item_id, exc)


async def seed(bus: Bus, owner: str) -> None:
    """The templates PAI ships (services/rest/market/builtin/*.yaml, OpenPAI v2 item files),
    public and approved, owned by the platform's admin; each created once, under a fixed
    id, and never written again (an admin may change or delete them)."""
    admin = Caller(username=owner, admin=True)
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        text = path.read_text()
        fields = core.from_v2(text, visibility=core.Visibility.PUBLIC)
        if await get_json(await _kv(bus), item_key(path.stem), MarketItem) is not None:
            continue
        try:
            await create(bus, admin, fields, item_id=path.stem, builtin=True)
            log.info("marketplace: added the built-in item %s", path.stem)
        except Conflict:
            pass  # another rest replica added it first
