"""Every service's core stays pure (docs/architecture.md, "Code style"): importing it, even
indirectly, loads no asyncio, nats, aiohttp or kubernetes. Each core is imported in a fresh
interpreter, so what other tests imported does not hide a leak.

msgspec and the stdlib modules the cores use do not load asyncio (checked here too), so
asyncio is asserted as well. YAML is not: the job model's package (libs.common.protocol)
loads the job parser, which reads YAML; what the scheduler core must not load is its
cluster-config loader.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CORES = sorted(f"services.{path.parent.parent.name}.core" for path in ROOT.glob("services/*/core/__init__.py"))
FORBIDDEN = ("asyncio", "nats", "aiohttp", "kubernetes")
ALSO_FORBIDDEN = {"services.scheduler.core": ("services.scheduler.cluster.loader",)}


def _loaded_after_import(module: str, watched: tuple[str, ...]) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"print(json.dumps([name for name in {list(watched)!r} if name in sys.modules]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_core_is_listed():
    assert {"services.launcher.core", "services.runtime.core", "services.scheduler.core"} <= set(CORES)


@pytest.mark.parametrize("core", CORES)
def test_core_imports_no_io_libraries(core):
    watched = FORBIDDEN + ALSO_FORBIDDEN.get(core, ())
    assert _loaded_after_import(core, watched) == []


def test_msgspec_and_the_shared_messages_load_no_asyncio():
    assert _loaded_after_import("msgspec", FORBIDDEN) == []
    assert _loaded_after_import("libs.common.rules_messages", FORBIDDEN) == []
