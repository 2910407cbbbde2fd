"""Whatever arrives, the protocol parser and the message decoders answer with their
documented errors only: a job is accepted or refused with FieldErrors that each
name a path; an event decodes or raises msgspec's DecodeError (ValidationError is one)."""

from __future__ import annotations

import json

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from libs.common.errors import TooLarge
from libs.common.messages import EVENT_TYPES, decode, decoder_for
from libs.common.protocol import ParsedJob, ProtocolError, parse_job
from tests.unit.test_protocol import BASE_JOB

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
)
json_values = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=25,
)
# Keys a job really has, so random values land where validation looks.
JOB_KEYS = st.sampled_from(["protocolVersion", "name", "type", "jobRetryCount", "taskRoles", "parameters", "secrets",
                            "prerequisites", "deployments", "defaults", "extras", "instances", "commands",
                            "resourcePerInstance", "cpu", "gpu", "memoryMB", "ports", "completion", "worker"])
job_like = st.recursive(
    scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(JOB_KEYS, inner, max_size=5)),
    max_leaves=30,
)


def _outcome(body: bytes | str, content_type: str) -> ParsedJob | ProtocolError | TooLarge:
    try:
        return parse_job(body, content_type=content_type, user="fuzz")
    except (ProtocolError, TooLarge) as refused:
        return refused


def _check(outcome) -> None:
    if isinstance(outcome, ProtocolError):
        assert outcome.errors
        for error in outcome.errors:
            assert error.path and error.rule and error.message
    elif isinstance(outcome, ParsedJob):
        msgspec.json.encode(outcome.spec)  # what travels on the bus encodes


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_are_refused_with_field_errors(body):
    _check(_outcome(body, "text/yaml"))
    _check(_outcome(body, "application/json"))


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("[]{}:,-'\"&*!|>#%@` \n\tab1")), max_size=200))
def test_yaml_punctuation_soup_is_refused_with_field_errors(text):
    _check(_outcome(text, "text/yaml"))


@FUZZ
@given(json_values)
def test_random_json_is_refused_with_field_errors(value):
    _check(_outcome(json.dumps(value), "application/json"))


@FUZZ
@given(st.dictionaries(JOB_KEYS, job_like, max_size=6))
def test_random_changes_to_a_real_job_are_accepted_or_refused_by_path(changes):
    document = {**BASE_JOB, **changes}
    _check(_outcome(json.dumps(document), "application/json"))
    _check(_outcome(yaml.safe_dump(document), "text/yaml"))


@FUZZ
@given(st.sampled_from(sorted(EVENT_TYPES)), st.binary(max_size=300))
def test_every_event_decoder_refuses_random_bytes_with_decode_error(kind, data):
    for decoder in (decoder_for(EVENT_TYPES[kind]), msgspec.json.Decoder(EVENT_TYPES[kind])):
        try:
            decoder.decode(data)
        except msgspec.DecodeError:
            pass


@FUZZ
@given(st.sampled_from(sorted(EVENT_TYPES)), st.dictionaries(st.sampled_from(
    ["kind", "id", "job", "vc", "attempt", "spec", "tasks", "role", "index", "exitCode", "state", "node", "reason",
     "healthy", "by", "cause", "at"]), json_values, max_size=8))
def test_every_event_decoder_refuses_random_json_with_a_path(kind, fields):
    event_type = EVENT_TYPES[kind]
    fields = {"kind": kind, **fields} if "kind" not in fields else fields
    data = json.dumps(fields).encode()
    for decode_one in (decoder_for(event_type).decode, decode):
        try:
            decode_one(data)
        except msgspec.ValidationError as exc:
            # a field of the wrong type is named: "... - at `$.attempt`"
            message = str(exc)
            assert "at `$" in message or "missing required field" in message or "Invalid value" in message \
                or "Expected `object`" in message, message
        except msgspec.DecodeError:
            pass


@pytest.mark.parametrize("kind", sorted(EVENT_TYPES))
def test_a_wrong_field_type_in_each_event_is_named_by_path(kind):
    bad = json.dumps({"kind": kind, "id": 5, "job": "a~b"}).encode()
    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.id`"):
        decoder_for(EVENT_TYPES[kind]).decode(bad)
