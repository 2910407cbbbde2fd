"""`pai simulate` as a user runs it: files in, report.json and plots out, clear errors."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from tests.unit.sim.helpers import TRACES

HAND = ["--trace", str(TRACES / "hand-12.csv"), "--cluster", str(TRACES / "hand-vcs.csv"), "--gpus-per-node", "4"]


def test_simulate_writes_the_report_and_plots_of_every_policy(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    assert main(["simulate", *HAND, "--policy", "all", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["policies"]) == ["hived", "private", "fifo-quota", "sjf", "helios-fifo", "helios-sjf"]
    assert report["sharing_anomaly"]["hived"]["vcs_with_anomaly"] == []
    assert report["sharing_anomaly"]["fifo-quota"]["vcs_with_anomaly"] == ["a", "b"]
    for name in ("delay-cdf.png", "jct-cdf.png", "allocation.png", "hived-delay-cdf.png", "sjf-delay-cdf.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "no sharing anomaly with hived" in printed
    assert "sharing anomaly with fifo-quota: guaranteed jobs of a, b" in " ".join(printed.split())
    assert "report:" in printed


def test_policies_can_be_repeated_or_comma_separated(tmp_path):
    out = tmp_path / "out"
    assert main(["simulate", *HAND, "--policy", "sjf,hived", "--policy", "sjf", "--out", str(out),
                 "--no-plots", "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert list(report["policies"]) == ["sjf", "hived"]
    assert "sharing_anomaly" not in report  # needs the private policy to compare with
    assert not list(out.glob("*.png"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "lottery"], "unknown policy lottery"),
    (["--from", "next week"], "neither seconds nor a date"),
    (["--sample", "0"], "sample must be a fraction"),
], ids=["unknown-policy", "bad-window", "bad-sample"])
def test_bad_options_fail_with_a_message(tmp_path, capsys, extra, message):
    assert main(["simulate", *HAND, "--out", str(tmp_path), "--quiet", *extra]) == 2
    assert message in capsys.readouterr().err.replace("\n", " ")


def test_a_cluster_file_of_the_wrong_kind_fails_with_a_message(tmp_path, capsys):
    code = main(["simulate", "--trace", str(TRACES / "hand-12.csv"), "--cluster", str(TRACES / "hand-12.csv"),
                 "--out", str(tmp_path), "--quiet"])
    assert code == 2
    assert "not a cluster file" in capsys.readouterr().err


def test_skipped_rows_are_summarised_for_the_user(tmp_path, capsys):
    code = main(["simulate", "--trace", str(TRACES / "philly-small.csv"),
                 "--cluster", str(TRACES / "philly-vc-small.csv"), "--out", str(tmp_path), "--no-plots"])
    assert code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "skipped 1 x bad-duration: e.g. line 8: duration 'abc' is not a number of seconds" in printed
    assert "the cluster has no such VC: vc-gone (1 jobs)" in printed
