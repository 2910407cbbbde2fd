"""The published event catalogue matches the message Structs."""

from pathlib import Path

from libs.common.catalogue import render
from libs.common.messages import EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_event_catalogue_is_up_to_date():
    assert DOC.read_text() == render(), "regenerate: python -m libs.common.catalogue > docs/events.md"


def test_every_event_kind_is_documented_with_its_subject():
    text = DOC.read_text()
    for kind in EVENT_TYPES:
        assert f"## `{kind.value}`" in text
        assert f"pai.v1.{kind.value}." in text
