"""The marketplace's rules without I/O (services/rest/market/core.py): who sees and changes
an item, how its approval moves, its bounds, the v2 item files in and out, and the job
documents a template makes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from libs.common.errors import BadInput, Conflict, Forbidden
from libs.common.protocol import limits as L
from services.rest.market import core
from services.rest.market.core import Approval, Caller, Decision, ItemFields, Kind, Visibility
from tests.conftest import shared_path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "market"
BUILTIN = Path(core.__file__).parent / "builtin"
PROTOCOL = ("protocolVersion: 2\nname: demo\ntype: job\nparameters:\n  lr: '0.1'\n  epochs: '3'\n"
            "taskRoles:\n  main:\n    instances: 1\n    commands:\n      - echo <% $parameters.lr %> <% $parameters.epochs %>\n")

OWNER = Caller(username="alice", grouplist=("default", "vision"))
TEAMMATE = Caller(username="bob", grouplist=("default", "vision"))
STRANGER = Caller(username="carol", grouplist=("default",))
ADMIN = Caller(username="root", admin=True)


def fields(**changes) -> ItemFields:
    base = {"name": "Demo", "protocol": PROTOCOL, "tags": ["pytorch"], "category": "training"}
    return ItemFields(**{**base, **changes})


def item(by: Caller = OWNER, before=None, **changes):
    return core.saved(before, fields(**changes), by, item_id="demo-1", now=1.0)


# --- visibility ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("visibility", "groups", "approval_by", "seen_by"), [
    (Visibility.PRIVATE, [], None, {"alice", "root"}),
    (Visibility.GROUPS, ["vision"], None, {"alice", "bob", "root"}),
    (Visibility.PUBLIC, [], None, {"alice", "root"}),  # pending: not yet for others
    (Visibility.PUBLIC, [], Decision.APPROVE, {"alice", "bob", "carol", "root"}),
    (Visibility.PUBLIC, [], Decision.REJECT, {"alice", "root"}),
])
def test_who_sees_an_item(visibility, groups, approval_by, seen_by):
    it = item(visibility=visibility, groups=groups)
    if approval_by is not None:
        it = core.reviewed(it, approval_by, ADMIN, "", 2.0)
    seen = {c.username for c in (OWNER, TEAMMATE, STRANGER, ADMIN) if core.may_read(c, it)}
    assert seen == seen_by


def test_hidden_is_absent_and_visible_but_not_owned_is_forbidden():
    shared = item(visibility=Visibility.GROUPS, groups=["vision"])
    with pytest.raises(core.NoMarketItem) as hidden:
        core.changeable(STRANGER, shared, "demo-1")
    assert hidden.value.status == 404
    with pytest.raises(Forbidden):
        core.changeable(TEAMMATE, shared, "demo-1")
    assert core.changeable(ADMIN, shared, "demo-1") is shared
    assert core.changeable(OWNER, shared, "demo-1") is shared


# --- approval -----------------------------------------------------------------------------------

def test_review_table():
    pending = item(visibility=Visibility.PUBLIC)
    assert pending.approval == Approval.PENDING
    approved = core.reviewed(pending, Decision.APPROVE, ADMIN, "looks good", 2.0)
    assert (approved.approval, approved.reviewedBy, approved.reviewNote) == (Approval.APPROVED, "root", "looks good")
    rejected = core.reviewed(approved, Decision.REJECT, ADMIN, "", 3.0)
    assert rejected.approval == Approval.REJECTED
    assert core.reviewed(rejected, Decision.APPROVE, ADMIN, "", 4.0).approval == Approval.APPROVED
    with pytest.raises(Forbidden):
        core.reviewed(pending, Decision.APPROVE, OWNER, "", 2.0)  # the owner does not approve their own
    with pytest.raises(Conflict, match="only public items are reviewed"):
        core.reviewed(item(), Decision.APPROVE, ADMIN, "", 2.0)
    with pytest.raises(BadInput, match=f"note: .* limit is {L.MAX_MARKET_REVIEW_NOTE_CHARS}"):
        core.reviewed(pending, Decision.REJECT, ADMIN, "x" * (L.MAX_MARKET_REVIEW_NOTE_CHARS + 1), 2.0)


def test_approval_after_a_save():
    approved = core.reviewed(item(visibility=Visibility.PUBLIC), Decision.APPROVE, ADMIN, "", 2.0)
    # tags or sharing alone: the review stands
    assert item(before=approved, visibility=Visibility.PUBLIC, tags=["pytorch", "nlp"]).approval == Approval.APPROVED
    # the content changed: reviewed again
    changed = item(before=approved, visibility=Visibility.PUBLIC, description="new text")
    assert (changed.approval, changed.reviewedBy) == (Approval.PENDING, "")
    # not public: nobody reviews it
    assert item(before=approved, visibility=Visibility.PRIVATE).approval == Approval.NONE
    # an admin's own public item is approved by its save
    assert item(by=ADMIN, visibility=Visibility.PUBLIC).approval == Approval.APPROVED
    # a rejected item saved unchanged stays rejected; changed, it is pending again
    rejected = core.reviewed(approved, Decision.REJECT, ADMIN, "no", 3.0)
    assert item(before=rejected, visibility=Visibility.PUBLIC).approval == Approval.REJECTED
    assert item(before=rejected, visibility=Visibility.PUBLIC, summary="fixed").approval == Approval.PENDING


# --- bounds ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "path", "limit"), [
    ({"name": "n" * (L.MAX_MARKET_NAME_LENGTH + 1)}, "name", str(L.MAX_MARKET_NAME_LENGTH)),
    ({"name": " "}, "name", "must not be empty"),
    ({"summary": "s" * (L.MAX_MARKET_SUMMARY_CHARS + 1)}, "summary", str(L.MAX_MARKET_SUMMARY_CHARS)),
    ({"description": "d" * (L.MAX_MARKET_DESCRIPTION_CHARS + 1)}, "description", str(L.MAX_MARKET_DESCRIPTION_CHARS)),
    ({"tags": [f"t{i}" for i in range(L.MAX_MARKET_TAGS + 1)]}, "tags", str(L.MAX_MARKET_TAGS)),
    ({"tags": ["ok", "t" * (L.MAX_MARKET_TAG_LENGTH + 1)]}, "tags[1]", str(L.MAX_MARKET_TAG_LENGTH)),
    ({"tags": ["<script>"]}, "tags[0]", "letters, digits"),
    ({"groups": [f"g{i}" for i in range(L.MAX_MARKET_GROUPS + 1)], "visibility": Visibility.GROUPS}, "groups",
     str(L.MAX_MARKET_GROUPS)),
    ({"visibility": Visibility.GROUPS}, "groups", "at least one group"),
    ({"protocol": PROTOCOL + "#" * L.MAX_MARKET_PROTOCOL_BYTES}, "protocol", str(L.MAX_MARKET_PROTOCOL_BYTES)),
    ({"protocol": "protocolVersion: 2\nname: x\ntype: job\ntaskRoles:\n  m:\n    instances: 0\n    commands: [a]\n"},
     "protocol.taskRoles.m.instances", "at least 1"),
    ({"kind": Kind.DATA, "protocol": ""}, "uri", "must not be empty"),
    ({"kind": Kind.DATA, "protocol": "", "uri": "/x" * L.MAX_MARKET_URI_LENGTH}, "uri", str(L.MAX_MARKET_URI_LENGTH)),
])
def test_every_refusal_names_the_field_and_limit(changes, path, limit):
    with pytest.raises(BadInput) as refused:
        core.check_fields(fields(**changes), owner="alice")
    errors = refused.value.details["errors"]
    assert errors[0]["path"] == path, errors
    assert limit in errors[0]["message"] or limit in refused.value.message


def test_description_is_rendered_without_raw_html_or_script_links():
    html = core.render_markdown("# Title\n\n<script>alert(1)</script>\n\n[x](javascript:alert(1)) "
                                "<img src=x onerror=alert(1)>\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert "<h1>Title</h1>" in html and "<table>" in html
    assert "<script>" not in html and "<img" not in html and 'href="javascript:' not in html
    assert "&lt;script&gt;" in html


# --- v2 item files ----------------------------------------------------------------------------

def _roundtrip(text: str) -> None:
    first = core.from_v2(text)
    core.check_fields(first, owner="alice")
    stored = core.saved(None, first, OWNER, item_id="x-1", now=1.0)
    exported = core.to_v2(stored)
    second = core.from_v2(exported)
    assert second == first
    if first.kind == Kind.TEMPLATE:  # the file itself: OpenPAI's keys as they were, PAI's own marks beside them
        original, again = yaml.safe_load(text), yaml.safe_load(exported)
        for doc in (original, again):
            for extra in (core.TAGS_EXTRAS_KEY, core.KIND_EXTRAS_KEY, core.CATEGORY_EXTRAS_KEY):
                doc.get("extras", {}).pop(extra, None)
            if not doc.get("extras"):
                doc.pop("extras", None)
        original.pop("contributor")
        assert again.pop("contributor") == "alice"
        if core.NAME_PATTERN.match(original["name"]):
            assert again == original


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.yaml")), ids=lambda p: p.stem)
def test_v2_file_round_trip(path):
    _roundtrip(path.read_text())


@pytest.mark.parametrize("path", sorted(BUILTIN.glob("*.yaml")), ids=lambda p: p.stem)
def test_builtin_templates_are_valid_v2_files(path):
    _roundtrip(path.read_text())
    got = core.from_v2(path.read_text())
    assert got.kind == Kind.TEMPLATE and got.tags and got.category != "other" and core.parameters_of(got.protocol)


def test_openpai_marketplace_files_round_trip():
    folder = shared_path("reference", "openpaimarketplace", "item_protocols")
    files = sorted(folder.glob("*.yaml"))
    assert files
    for path in files:
        _roundtrip(path.read_text())


def test_data_item_from_a_v2_file():
    got = core.from_v2((FIXTURES / "text-dataset.yaml").read_text())
    assert (got.kind, got.uri, got.name) == (Kind.DATA, "/mnt/confignfs/text_data", "Text Dataset")
    assert got.description.startswith("# Text dataset")
    template = core.from_v2((FIXTURES / "lstm-training.yaml").read_text())
    assert template.kind == Kind.TEMPLATE and "lstm_training" in template.protocol
    with pytest.raises(BadInput, match="protocolVersion"):
        core.from_v2("name: x\n")


# --- using a template ---------------------------------------------------------------------

def test_job_documents_fill_parameters_and_name_the_item():
    it = item()
    (doc,) = core.job_documents(it, parameters={"lr": "0.5"}, sweep={}, name="", stamp="123")
    assert doc["parameters"] == {"lr": "0.5", "epochs": "3"}
    assert doc["extras"][core.JOB_EXTRAS_KEY] == "demo-1"
    assert doc["name"] == "demo-123"
    assert core.item_of_job_config(doc) == "demo-1"
    with pytest.raises(BadInput, match="no parameter 'momentum'"):
        core.job_documents(it, parameters={"momentum": "1"}, sweep={}, name="", stamp="1")


def test_a_sweep_makes_one_job_per_combination_within_its_limit():
    docs = core.job_documents(item(), parameters={}, sweep={"lr": ["0.1", "0.01"], "epochs": ["1", "2", "3"]},
                              name="s", stamp="1")
    assert [d["name"] for d in docs] == [f"s-{i}" for i in range(1, 7)]
    assert {(d["parameters"]["lr"], d["parameters"]["epochs"]) for d in docs} == {
        (lr, e) for lr in ("0.1", "0.01") for e in ("1", "2", "3")}
    with pytest.raises(BadInput, match=str(L.MAX_MARKET_SWEEP_JOBS)):
        core.job_documents(item(), parameters={}, sweep={"lr": [str(i) for i in range(5)],
                                                         "epochs": [str(i) for i in range(4)]}, name="", stamp="1")


def test_search():
    it = item(tags=["PyTorch", "nlp"], summary="An LSTM")
    q = core.Query
    assert core.matches(it, q(tags=("pytorch",)), caller=OWNER, stars_of_caller=set())
    assert not core.matches(it, q(tags=("pytorch", "vision")), caller=OWNER, stars_of_caller=set())
    assert core.matches(it, q(text="lstm demo"), caller=OWNER, stars_of_caller=set())
    assert not core.matches(it, q(category="data"), caller=OWNER, stars_of_caller=set())
    assert core.matches(it, q(starred_by="alice"), caller=OWNER, stars_of_caller={"demo-1"})
    assert not core.matches(it, q(mine=True), caller=TEAMMATE, stars_of_caller=set())


def test_a_data_prerequisite_takes_a_data_items_uri():
    template = core.saved(None, core.from_v2((FIXTURES / "lstm-training.yaml").read_text()), OWNER,
                          item_id="lstm-1", now=1.0)
    assert core.data_slots(template.protocol) == {"text_data": ["/mnt/confignfs/text_data"]}
    data = core.saved(None, ItemFields(name="Other text", kind=Kind.DATA, uri="/mnt/team/other_text"), OWNER,
                      item_id="other-1", now=1.0)
    (doc,) = core.job_documents(template, parameters={}, sweep={}, name="x", stamp="1", data_items={"text_data": data})
    assert [p["uri"] for p in doc["prerequisites"] if p["name"] == "text_data"] == [["/mnt/team/other_text"]]
    with pytest.raises(BadInput, match="no data prerequisite 'images'"):
        core.job_documents(template, parameters={}, sweep={}, name="x", stamp="1", data_items={"images": data})
    with pytest.raises(BadInput, match="not a data item"):
        core.job_documents(template, parameters={}, sweep={}, name="x", stamp="1", data_items={"text_data": template})
