"""`pai groups add/set`: the acls sent; `set` keeps the lists an option does not give (a
group's storages survive a change of its VCs)."""

from __future__ import annotations

import argparse

import pytest

from cli.users import _acls

KEPT = {"admin": False, "virtualClusters": ["old"], "priorityClasses": ["prod"], "storageConfigs": ["team"]}


def args(**given: object) -> argparse.Namespace:
    return argparse.Namespace(**{"admin": False, "vcs": "vision", "priority_classes": None, "storages": None, **given})


@pytest.mark.parametrize(("given", "kept", "expected"), [
    ({}, KEPT, {"priorityClasses": ["prod"], "storageConfigs": ["team"]}),  # set: both kept
    ({"storages": "a,b"}, KEPT, {"priorityClasses": ["prod"], "storageConfigs": ["a", "b"]}),
    ({"storages": ""}, KEPT, {"priorityClasses": ["prod"], "storageConfigs": []}),  # taken away
    ({"priority_classes": "crit"}, KEPT, {"priorityClasses": ["crit"], "storageConfigs": ["team"]}),
    ({"storages": "a"}, None, {"storageConfigs": ["a"]}),  # add
    ({}, None, {}),
])
def test_the_acls_sent(given, kept, expected):
    assert _acls(args(**given), kept) == {"admin": False, "virtualClusters": ["vision"], **expected}
