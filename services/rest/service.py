"""rest's process: the API app on the service shell."""

from __future__ import annotations

from libs.common import service
from libs.common.config import load_config
from libs.common.service import ServiceContext
from services.rest.app import create_app, startup


async def body(ctx: ServiceContext) -> None:
    await startup(ctx)
    ctx.set_ready()
    await ctx.stopping.wait()


def main() -> None:
    service.run("rest", load_config(), body, app_factory=create_app)
