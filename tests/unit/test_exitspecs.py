"""PAI's own exit specs agree with OpenPAI's exit spec where they overlap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from libs.common import exitspecs as exits

EXIT_SPEC = Path(__file__).resolve().parents[2] / ".." / "shared" / "reference" / "openpai" / "k8s-job-exit-spec.yaml"


@pytest.fixture(scope="module")
def openpai_codes() -> dict[int, dict]:
    if not EXIT_SPEC.exists():
        pytest.skip(f"reference files not present: {EXIT_SPEC}")
    document = yaml.safe_load(EXIT_SPEC.read_text())
    return {entry["code"]: entry for entry in document["spec"]}


REUSED = [
    ("success", exits.SUCCEEDED),
    ("stop", exits.stopped("alice")),
    ("attempt-completion", exits.ATTEMPT_COMPLETION),
]


@pytest.mark.parametrize("spec", [r[1] for r in REUSED], ids=[r[0] for r in REUSED])
def test_reused_codes_mean_what_openpai_says(openpai_codes, spec) -> None:
    theirs = openpai_codes[spec.code]
    assert (spec.phrase, spec.type, spec.reaction.value) == (theirs["phrase"], theirs["type"], theirs["reaction"])


@pytest.mark.parametrize(
    "code", [exits.PREEMPTED_EXIT_CODE, exits.PORTS_EXHAUSTED_EXIT_CODE], ids=["preempted", "ports-exhausted"]
)
def test_codes_pai_defines_are_free_in_openpai_and_in_the_launcher_range(openpai_codes, code) -> None:
    assert code not in openpai_codes
    assert -999 <= code <= -1


def test_lost_task_code_is_openpai_node_lost(openpai_codes) -> None:
    assert openpai_codes[exits.LOST_EXIT_CODE]["phrase"] == "PodNodeLost"
