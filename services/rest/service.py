"""rest's process: the API app on the service shell."""

from __future__ import annotations

import gc

from libs.common import service
from libs.common.config import load_config
from libs.common.service import ServiceContext
from services.rest.app import create_app, startup


async def body(ctx: ServiceContext) -> None:
    await startup(ctx)
    ctx.set_ready()
    await ctx.stopping.wait()


# Allocations between two collections of the youngest generation (CPython's default: 700).
# A submission makes and drops thousands of objects (the YAML nodes, the document, the
# spec, the HTTP request); at the default a collection lands in nearly every request and
# walks what is alive at that moment, all of it freed by reference counting moments later.
YOUNG_COLLECTION_ALLOCATIONS = 20_000


def main() -> None:
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *gc.get_threshold()[1:])
    service.run("rest", load_config(), body, app_factory=create_app)
