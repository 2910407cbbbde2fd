"""The marketplace's decisions, without I/O: what an item is, who may see and change it,
how its admin approval moves, and OpenPAI's marketplace v2 item files in and out.

An item is a job template (an OpenPAI v2 job document with its parameters) or a data
item (a storage path or URI that templates refer to), with a Markdown description,
an owner, tags, a category and a visibility:

- `private`: its owner (and admins) alone;
- `groups`: also the members of the groups it names;
- `public`: everyone, once an admin approved it (`approval`: pending -> approved or
  rejected, as OpenPAI's marketplace reviews items); until then as `private`.

An item someone may not see is answered as absent (404), so a private item's name is
not given away; one they may see but not change is a 403.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import msgspec
import yaml
from markdown_it import MarkdownIt

from libs.common.errors import BadInput, Conflict, Forbidden, NotFound
from libs.common.ids import NAME_PATTERN
from libs.common.protocol import limits as L
from libs.common.protocol.document import load_document
from libs.common.protocol.model import ProtocolError
from libs.common.protocol.parse import parse_job

# What a job made from an item carries, so that its page links back and the item counts it.
JOB_EXTRAS_KEY = "marketplaceItem"
# What PAI adds to the v2 files it exports, so that a file read back is the same item
# (OpenPAI's files carry neither; PAI's protocol check keeps them as extras it does not act on).
TAGS_EXTRAS_KEY = "marketplaceTags"
KIND_EXTRAS_KEY = "marketplaceKind"
CATEGORY_EXTRAS_KEY = "marketplaceCategory"
TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]*$")


class NoMarketItem(NotFound):
    code = "NoMarketItemError"


class Kind(StrEnum):
    TEMPLATE = "template"
    DATA = "data"


class Visibility(StrEnum):
    PRIVATE = "private"
    GROUPS = "groups"
    PUBLIC = "public"


class Approval(StrEnum):
    NONE = "none"  # not public: nobody reviews it
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"


class ItemFields(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a user gives when creating or changing an item (the API's body)."""

    name: str
    kind: Kind = Kind.TEMPLATE
    summary: str = ""
    description: str = ""  # Markdown
    category: str = "other"
    tags: list[str] = []
    visibility: Visibility = Visibility.PRIVATE
    groups: list[str] = []
    protocol: str = ""  # a template's OpenPAI v2 job document (YAML)
    uri: str = ""  # a data item's storage path or URI


class MarketItem(msgspec.Struct, frozen=True, kw_only=True):
    """One item as stored in pai_market under `item.<id>`."""

    id: str
    name: str
    kind: Kind
    owner: str
    summary: str = ""
    description: str = ""
    category: str = "other"
    tags: list[str] = []
    visibility: Visibility = Visibility.PRIVATE
    groups: list[str] = []
    approval: Approval = Approval.NONE
    reviewedBy: str = ""
    reviewNote: str = ""
    protocol: str = ""
    uri: str = ""
    builtin: bool = False  # shipped with PAI (services/rest/market/builtin)
    submits: int = 0  # jobs submitted from it
    createdAt: float = 0.0
    updatedAt: float = 0.0

    def fields(self) -> ItemFields:
        return ItemFields(name=self.name, kind=self.kind, summary=self.summary, description=self.description,
                          category=self.category, tags=self.tags, visibility=self.visibility, groups=self.groups,
                          protocol=self.protocol, uri=self.uri)


class Caller(msgspec.Struct, frozen=True, kw_only=True):
    """Who asks: what the rules below need of services/rest/identity's Principal."""

    username: str
    admin: bool = False
    grouplist: tuple[str, ...] = ()


# --- checks ----------------------------------------------------------------------------------


def bad(path: str, rule: str, message: str) -> BadInput:
    return BadInput(f"{path}: {message}", details={"errors": [{"path": path, "rule": rule, "message": message}]})


def check_item_id(item_id: str, path: str = "id") -> None:
    if not item_id or len(item_id) > L.MAX_MARKET_ITEM_ID_LENGTH:
        raise bad(path, "maxLength", f"an item id is 1 to {L.MAX_MARKET_ITEM_ID_LENGTH} characters, got {len(item_id)}")
    if not NAME_PATTERN.match(item_id):
        raise bad(path, "pattern", "an item id is letters, digits, _ and - (^[a-zA-Z0-9_-]+$)")


def _text(value: str, path: str, most: int, *, required: bool = False, unit: str = "characters") -> None:
    size = len(value.encode()) if unit == "bytes" else len(value)
    if required and not value.strip():
        raise bad(path, "required", "must not be empty")
    if size > most:
        raise bad(path, "maxLength", f"is {size} {unit}; the limit is {most} {unit}")


def check_fields(fields: ItemFields, *, owner: str) -> None:
    """Every bound of an item, the first broken one named with its field and limit;
    a template's protocol is checked as a submission would be (paths under `protocol.`)."""
    _text(fields.name, "name", L.MAX_MARKET_NAME_LENGTH, required=True)
    _text(fields.summary, "summary", L.MAX_MARKET_SUMMARY_CHARS)
    _text(fields.description, "description", L.MAX_MARKET_DESCRIPTION_CHARS)
    _text(fields.category, "category", L.MAX_MARKET_CATEGORY_LENGTH, required=True)
    if not TAG_PATTERN.match(fields.category):
        raise bad("category", "pattern", "a category starts with a letter or digit and holds letters, digits, "
                                         "spaces and . _ + -")
    if len(fields.tags) > L.MAX_MARKET_TAGS:
        raise bad("tags", "maxItems", f"{len(fields.tags)} tags; the limit is {L.MAX_MARKET_TAGS}")
    for i, tag in enumerate(fields.tags):
        _text(tag, f"tags[{i}]", L.MAX_MARKET_TAG_LENGTH, required=True)
        if not TAG_PATTERN.match(tag):
            raise bad(f"tags[{i}]", "pattern", "a tag starts with a letter or digit and holds letters, digits, "
                                               "spaces and . _ + -")
    if len(fields.groups) > L.MAX_MARKET_GROUPS:
        raise bad("groups", "maxItems", f"{len(fields.groups)} groups; the limit is {L.MAX_MARKET_GROUPS}")
    for i, group in enumerate(fields.groups):
        if not NAME_PATTERN.match(group) or len(group) > L.MAX_NAME_LENGTH:
            raise bad(f"groups[{i}]", "pattern", f"a group name is 1 to {L.MAX_NAME_LENGTH} of letters, digits, _ and -")
    if fields.visibility == Visibility.GROUPS and not fields.groups:
        raise bad("groups", "required", "an item shared with groups names at least one group")
    if fields.kind == Kind.TEMPLATE:
        if fields.uri:
            raise bad("uri", "kind", "a template has no uri; a data item has (kind: data)")
        _text(fields.protocol, "protocol", L.MAX_MARKET_PROTOCOL_BYTES, required=True, unit="bytes")
        check_protocol(fields.protocol, owner)
    else:
        if fields.protocol:
            raise bad("protocol", "kind", "a data item has no protocol; a template has (kind: template)")
        _text(fields.uri, "uri", L.MAX_MARKET_URI_LENGTH, required=True)
        if any(ch.isspace() for ch in fields.uri):
            raise bad("uri", "pattern", "a storage path or URI has no spaces")


def check_protocol(text: str, owner: str) -> None:
    """The template as PAI would take it at submission; 400 naming each refused field under `protocol.`."""
    try:
        parse_job(text, content_type="text/yaml", user=owner)
    except ProtocolError as exc:
        errors = [{"path": f"protocol.{e.path}" if e.path != "$" else "protocol", "rule": e.rule,
                   "message": e.message, **({"line": e.line} if e.line is not None else {})} for e in exc.errors]
        first = errors[0]
        raise BadInput(f"{first['path']}: {first['message']}", details={"errors": errors}) from None


# --- who may do what ---------------------------------------------------------------------------


def may_read(caller: Caller, item: MarketItem) -> bool:
    if caller.admin or caller.username == item.owner:
        return True
    if item.visibility == Visibility.PUBLIC:
        return item.approval == Approval.APPROVED
    if item.visibility == Visibility.GROUPS:
        return bool(set(item.groups) & set(caller.grouplist))
    return False


def may_change(caller: Caller, item: MarketItem) -> bool:
    return caller.admin or caller.username == item.owner


def readable(caller: Caller, item: MarketItem | None, item_id: str) -> MarketItem:
    """The item, or 404 for one absent or hidden from the caller (the same answer)."""
    if item is None or not may_read(caller, item):
        raise NoMarketItem(f"no marketplace item {item_id[:64]!r} (or it is not shared with {caller.username})")
    return item


def changeable(caller: Caller, item: MarketItem | None, item_id: str) -> MarketItem:
    """The item its owner or an admin may change: 404 when hidden, 403 when only visible."""
    seen = readable(caller, item, item_id)
    if not may_change(caller, seen):
        raise Forbidden(f"item {item_id} belongs to {seen.owner}; only they or an admin may change it")
    return seen


# --- approval --------------------------------------------------------------------------------

# An admin's review: (state, decision) -> state. Not listed: 409 naming the state.
REVIEWS: dict[tuple[Approval, Decision], Approval] = {
    (Approval.PENDING, Decision.APPROVE): Approval.APPROVED,
    (Approval.PENDING, Decision.REJECT): Approval.REJECTED,
    (Approval.APPROVED, Decision.APPROVE): Approval.APPROVED,
    (Approval.APPROVED, Decision.REJECT): Approval.REJECTED,  # taken back
    (Approval.REJECTED, Decision.APPROVE): Approval.APPROVED,
    (Approval.REJECTED, Decision.REJECT): Approval.REJECTED,
}


def reviewed(item: MarketItem, decision: Decision, caller: Caller, note: str, now: float) -> MarketItem:
    if not caller.admin:
        raise Forbidden(f"only admins review marketplace items; {caller.username} is not one")
    _text(note, "note", L.MAX_MARKET_REVIEW_NOTE_CHARS)
    after = REVIEWS.get((item.approval, decision))
    if after is None:
        raise Conflict(f"item {item.id} is {item.visibility} (approval {item.approval}): only public items are reviewed")
    return msgspec.structs.replace(item, approval=after, reviewedBy=caller.username, reviewNote=note, updatedAt=now)


def approval_after_save(before: MarketItem | None, fields: ItemFields, caller: Caller, owner: str) -> Approval:
    """The approval an item has once saved with `fields`:
    - not public: none;
    - public, saved by an admin who owns it: approved (their save is the review);
    - public and approved before, its content unchanged (tags, say, or visibility alone): still approved;
    - rejected before and unchanged: still rejected (the admin's note stands);
    - otherwise: pending, for an admin to review."""
    if fields.visibility != Visibility.PUBLIC:
        return Approval.NONE
    if caller.admin and caller.username == owner:
        return Approval.APPROVED
    if before is not None and before.visibility == Visibility.PUBLIC and _content(before.fields()) == _content(fields):
        if before.approval in (Approval.APPROVED, Approval.REJECTED):
            return before.approval
    if caller.admin and before is not None and before.approval != Approval.NONE:
        return before.approval  # an admin's edit of someone's public item keeps its review
    return Approval.PENDING


def _content(fields: ItemFields) -> tuple[Any, ...]:
    """What a review looked at: the text, the template, the data, not the tags or sharing."""
    return (fields.name, fields.kind, fields.summary, fields.description, fields.protocol, fields.uri)


def saved(before: MarketItem | None, fields: ItemFields, caller: Caller, *, item_id: str, now: float) -> MarketItem:
    owner = before.owner if before is not None else caller.username
    check_fields(fields, owner=owner)
    approval = approval_after_save(before, fields, caller, owner)
    keep_review = before is not None and approval == before.approval
    return MarketItem(
        id=item_id, name=fields.name, kind=fields.kind, owner=owner, summary=fields.summary,
        description=fields.description, category=fields.category, tags=list(dict.fromkeys(fields.tags)),
        visibility=fields.visibility, groups=sorted(set(fields.groups)), approval=approval,
        reviewedBy=before.reviewedBy if before is not None and keep_review else "",
        reviewNote=before.reviewNote if before is not None and keep_review else "",
        protocol=fields.protocol, uri=fields.uri, builtin=before.builtin if before is not None else False,
        submits=before.submits if before is not None else 0,
        createdAt=before.createdAt if before is not None else now, updatedAt=now)


def new_item_id(name: str, taken: set[str], suffix: str) -> str:
    """An id from the item's name (`pytorch-ddp-3f9a1c`): readable in a URL, unique by its suffix."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "item"
    item_id = f"{slug}-{suffix}"
    return item_id if item_id not in taken else f"{slug}-{suffix}x"


# --- search ----------------------------------------------------------------------------------


class Query(msgspec.Struct, frozen=True, kw_only=True):
    text: str = ""  # in the name, summary, description, tags
    tags: tuple[str, ...] = ()  # every one of them
    category: str = ""
    kind: str = ""
    owner: str = ""
    approval: str = ""  # e.g. pending: an admin's review queue
    starred_by: str = ""  # the caller's starred items
    mine: bool = False


def matches(item: MarketItem, query: Query, *, caller: Caller, stars_of_caller: set[str]) -> bool:
    if query.kind and item.kind != query.kind:
        return False
    if query.category and item.category.lower() != query.category.lower():
        return False
    lowered = {t.lower() for t in item.tags}
    if any(t.lower() not in lowered for t in query.tags):
        return False
    if query.owner and item.owner != query.owner:
        return False
    if query.mine and item.owner != caller.username:
        return False
    if query.approval and item.approval != query.approval:
        return False
    if query.starred_by and item.id not in stars_of_caller:
        return False
    if query.text:
        hay = " ".join([item.name, item.summary, item.description, *item.tags, item.category]).lower()
        return all(word in hay for word in query.text.lower().split())
    return True


# --- what the API answers --------------------------------------------------------------------

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")


def render_markdown(text: str) -> str:
    """The description as HTML safe to show: markdown-it with raw HTML off (written HTML
    comes out as text) and its link check (no javascript:, vbscript:, file: or data:
    URLs but images')."""
    return _markdown.render(text)


def _template_document(protocol: str) -> dict[str, Any]:
    """A template's job document, or {} where there is none or it does not read (an
    item's own view then shows no parameters or data slots rather than failing)."""
    if not protocol:
        return {}
    try:
        data = load_document(protocol, "text/yaml").data
    except ProtocolError:
        return {}
    return data if isinstance(data, dict) else {}


def parameters_of(protocol: str) -> dict[str, str]:
    """A template's `parameters` (each a default the user may change when using it)."""
    return _parameters(_template_document(protocol))


def _parameters(document: dict[str, Any]) -> dict[str, str]:
    params = document.get("parameters")
    if not isinstance(params, dict):
        return {}
    return {str(k): "" if v is None else str(v) for k, v in params.items()}


def summary_of(item: MarketItem, *, stars: int, starred: bool) -> dict[str, Any]:
    return {"id": item.id, "name": item.name, "kind": item.kind, "owner": item.owner, "author": item.owner,
            "summary": item.summary, "category": item.category, "tags": item.tags, "visibility": item.visibility,
            "groups": item.groups, "approval": item.approval, "builtin": item.builtin, "submits": item.submits,
            "stars": stars, "starred": starred, "createdAt": item.createdAt, "updatedAt": item.updatedAt}


def detail_of(item: MarketItem, *, stars: int, starred: bool, caller: Caller, revision: int) -> dict[str, Any]:
    document = _template_document(item.protocol)
    return {**summary_of(item, stars=stars, starred=starred), "description": item.description,
            "descriptionHtml": render_markdown(item.description), "protocol": item.protocol, "uri": item.uri,
            "parameters": _parameters(document), "data": _data_slots(document),
            "reviewedBy": item.reviewedBy,
            "reviewNote": item.reviewNote, "mayChange": may_change(caller, item), "revision": revision}


# --- using a template --------------------------------------------------------------------------


def data_slots(protocol: str) -> dict[str, list[str]]:
    """A template's prerequisites of type data (name -> its uris): where a data item goes."""
    return _data_slots(_template_document(protocol))


def _data_slots(document: dict[str, Any]) -> dict[str, list[str]]:
    slots: dict[str, list[str]] = {}
    for p in document.get("prerequisites") or []:
        if isinstance(p, dict) and p.get("type") == "data" and isinstance(p.get("name"), str):
            uri = p.get("uri")
            slots[p["name"]] = [str(u) for u in uri] if isinstance(uri, list) else [str(uri)] if uri else []
    return slots


def job_documents(item: MarketItem, *, parameters: dict[str, str], sweep: dict[str, list[str]],
                  name: str, stamp: str, data_items: dict[str, MarketItem] | None = None) -> list[dict[str, Any]]:
    """The job document(s) a template makes: its parameters as given, each data prerequisite
    named in `data_items` pointing at that data item's uri, the job named `name` (or the
    template's name and `stamp`), `extras.marketplaceItem` naming the item.
    A sweep makes one job per combination of its values (at most MAX_MARKET_SWEEP_JOBS)."""
    if item.kind != Kind.TEMPLATE:
        raise BadInput(f"item {item.id} is a data item: refer to its uri ({item.uri}) from a template's "
                       "prerequisites (type: data); only templates make jobs")
    data = load_document(item.protocol, "text/yaml").data
    slots = _data_slots(data)
    for slot, given in (data_items or {}).items():
        if slot not in slots:
            raise bad(f"data.{slot}", "unknown_prerequisite",
                      f"the template has no data prerequisite {slot!r}; it has: {', '.join(slots) or 'none'}")
        if given.kind != Kind.DATA:
            raise bad(f"data.{slot}", "kind", f"item {given.id} is a template, not a data item")
    if data_items:
        data["prerequisites"] = [
            {**p, "uri": [data_items[p["name"]].uri]}
            if isinstance(p, dict) and p.get("type") == "data" and p.get("name") in data_items else p
            for p in data.get("prerequisites") or []]
    known = _parameters(data)  # prerequisites alone changed above
    for key in [*parameters, *sweep]:
        if key not in known:
            raise bad(f"parameters.{key}", "unknown_parameter",
                      f"the template has no parameter {key!r}; it has: {', '.join(known) or 'none'}")
    combos: list[dict[str, str]] = [{}]
    for key, values in sweep.items():
        if not values:
            raise bad(f"sweep.{key}", "required", "a swept parameter has at least one value")
        combos = [{**c, key: str(v)} for c in combos for v in values]
        if len(combos) > L.MAX_MARKET_SWEEP_JOBS:
            raise bad("sweep", "maxItems", f"the sweep makes more than {L.MAX_MARKET_SWEEP_JOBS} jobs; "
                                           "PAI's limit per sweep")
    base = name or f"{_job_slug(data.get('name') or item.name)}-{stamp}"
    docs = []
    for i, combo in enumerate(combos):
        doc = dict(data)
        doc["name"] = base if len(combos) == 1 else f"{base}-{i + 1}"
        doc["parameters"] = {**known, **{k: str(v) for k, v in parameters.items()}, **combo}
        extras = doc.get("extras") if isinstance(doc.get("extras"), dict) else {}
        doc["extras"] = {**extras, JOB_EXTRAS_KEY: item.id}
        docs.append(doc)
    return docs


def _job_slug(name: str) -> str:
    return (re.sub(r"[^a-zA-Z0-9_-]+", "-", str(name)).strip("-") or "job")[:40]


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


def item_of_job_config(config: Any) -> str | None:
    """The item a submitted job came from (its `extras.marketplaceItem`), if any."""
    extras = config.get("extras") if isinstance(config, dict) else None
    value = extras.get(JOB_EXTRAS_KEY) if isinstance(extras, dict) else None
    return value if isinstance(value, str) else None


# --- OpenPAI's marketplace v2 item files ------------------------------------------------------


def from_v2(text: str, *, kind: str = "", category: str = "", tags: list[str] | None = None,
            visibility: Visibility = Visibility.PRIVATE, groups: list[str] | None = None) -> ItemFields:
    """An item from one of OpenPAI's marketplace v2 files: a job protocol with `contributor`
    and a Markdown `description`. A data item's file (kind `data`, or a file whose only
    prerequisites with a uri are of type data and that names no image) gives its uri from
    its first `type: data` prerequisite."""
    _text(text, "file", L.MAX_MARKET_PROTOCOL_BYTES + L.MAX_MARKET_DESCRIPTION_CHARS, unit="bytes")
    try:
        data = load_document(text, "text/yaml").data
    except ProtocolError as exc:
        raise bad("file", "yaml", f"not an OpenPAI v2 item file: {exc}") from None
    if data.get("protocolVersion") not in (2, "2"):
        raise bad("file.protocolVersion", "enum", "an OpenPAI marketplace v2 item file has protocolVersion: 2")
    data_uri = _data_uri(data)
    extras = data.get("extras") if isinstance(data.get("extras"), dict) else {}
    if not kind and extras.get(KIND_EXTRAS_KEY) in (Kind.DATA, Kind.TEMPLATE):
        kind = str(extras[KIND_EXTRAS_KEY])
    if kind and kind not in (Kind.DATA, Kind.TEMPLATE):
        raise bad("kind", "enum", f"{kind[:32]!r} is not a kind; use template or data")
    chosen = Kind(kind) if kind else (Kind.DATA if data_uri is not None and _is_data_file(data) else Kind.TEMPLATE)
    description = str(data.get("description") or "")
    name = str(data.get("name") or "")
    tags = tags if tags is not None else [str(t) for t in (extras.get(TAGS_EXTRAS_KEY) or []) if t][:L.MAX_MARKET_TAGS]
    category = category or str(extras.get(CATEGORY_EXTRAS_KEY) or "")
    summary = description.strip().splitlines()[0].lstrip("# ").strip()[:L.MAX_MARKET_SUMMARY_CHARS] if description.strip() else ""
    if chosen == Kind.DATA:
        if data_uri is None:
            raise bad("file.prerequisites", "required", "a data item's file has a prerequisite of type data with a uri")
        return ItemFields(name=name, kind=Kind.DATA, summary=summary, description=description,
                          category=category or "data", tags=tags, visibility=visibility, groups=groups or [],
                          uri=data_uri)
    protocol = {k: v for k, v in data.items() if k not in ("contributor", "description")}
    if not NAME_PATTERN.match(name) or len(name) > L.MAX_JOB_NAME_LENGTH:  # "Couplet Training": a job name of it
        protocol["name"] = _job_slug(name).lower()
    own_extras = {k: v for k, v in extras.items() if k not in (TAGS_EXTRAS_KEY, KIND_EXTRAS_KEY, CATEGORY_EXTRAS_KEY)}
    if own_extras:
        protocol["extras"] = own_extras
    else:
        protocol.pop("extras", None)
    return ItemFields(name=name, kind=Kind.TEMPLATE, summary=summary, description=description,
                      category=category or "other", tags=tags, visibility=visibility, groups=groups or [],
                      protocol=dump_yaml(protocol))


def _data_uri(data: dict[str, Any]) -> str | None:
    for p in data.get("prerequisites") or []:
        if isinstance(p, dict) and p.get("type") == "data":
            uri = p.get("uri")
            if isinstance(uri, list):
                uri = uri[0] if uri else None
            if isinstance(uri, str) and uri.strip():
                return uri.strip()
    return None


def _is_data_file(data: dict[str, Any]) -> bool:
    """OpenPAI's data items are job files whose commands only say where the data is."""
    name = str(data.get("name") or "").lower()
    return "dataset" in name or "data" in name.split()


def to_v2(item: MarketItem) -> str:
    """The item as an OpenPAI marketplace v2 file: its protocol with `contributor` (the
    owner) and `description`; a data item as a small job that mounts nothing and says
    where its data is (`prerequisites: [{type: data, uri: [...]}]`, `$DATA_DIR`)."""
    head: dict[str, Any] = {"protocolVersion": 2, "name": item.name, "type": "job", "contributor": item.owner,
                            "description": item.description}
    if item.kind == Kind.TEMPLATE:
        body = load_document(item.protocol, "text/yaml").data
        doc = {**head, **{k: v for k, v in body.items() if k not in ("protocolVersion", "name", "type",
                                                                     "contributor", "description")}}
        doc["name"] = item.name
    else:
        doc = {**head,
               "prerequisites": [{"name": "data", "type": "data", "uri": [item.uri]}],
               "taskRoles": {"taskrole": {"instances": 1, "data": "data",
                                          "resourcePerInstance": {"cpu": 1, "memoryMB": 256, "gpu": 0},
                                          "commands": ["export DATA_DIR=<% $data.uri[0] %>",
                                                       'echo "the data is at $DATA_DIR"']}}}
    extras = dict(doc.get("extras") or {}) if isinstance(doc.get("extras"), dict) else {}
    if item.tags:
        extras[TAGS_EXTRAS_KEY] = item.tags
    extras[CATEGORY_EXTRAS_KEY] = item.category
    if item.kind == Kind.DATA:
        extras[KIND_EXTRAS_KEY] = "data"
    if extras:
        doc["extras"] = extras
    return dump_yaml(doc)
