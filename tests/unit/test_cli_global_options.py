"""`pai`'s own options read the same before or after the subcommand."""

from __future__ import annotations

import pytest

from cli.main import build_parser


@pytest.mark.parametrize("argv,data_dir,url,token", [
    (["up", "--data-dir", "D"], "D", None, None),
    (["--data-dir", "D", "up"], "D", None, None),
    (["--data-dir", "before", "list", "--data-dir", "after"], "after", None, None),
    (["list", "--url", "http://h:1", "--token", "t"], None, "http://h:1", "t"),
    (["rules", "list", "--url", "http://h:1"], None, "http://h:1", None),
    (["status", "alice~job", "--data-dir", "D"], "D", None, None),
], ids=["after-up", "before-up", "after-wins", "after-list", "nested-subcommand", "after-positional"])
def test_global_options_anywhere(argv, data_dir, url, token):
    args = build_parser().parse_args(argv)
    assert (args.data_dir, args.url, args.token) == (data_dir, url, token)


def test_up_takes_the_cpus_to_offer():
    assert build_parser().parse_args(["up", "--cpus", "2"]).cpus == 2
    assert build_parser().parse_args(["up"]).cpus is None
