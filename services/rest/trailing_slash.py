"""A trailing slash is the same route: `/api/v2/users/` is `/api/v2/users`, as OpenPAI's
server (Express) answers both and its clients send both.

A resource registered last (under `/api`) that, for a path ending in `/` which nothing
else matched, resolves the path without its slashes and answers with that route: no
redirect (a redirected PUT or DELETE loses its body in some clients), and no second copy
of every route in the router (the OpenAPI document lists each route once).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource, UrlDispatcher, UrlMappingMatchInfo

PREFIX = "/api"


class TrailingSlash(AbstractResource):
    def __init__(self, router: UrlDispatcher) -> None:
        super().__init__(name=None)
        self._router = router

    @property
    def canonical(self) -> str:
        return PREFIX + "/"

    def url_for(self, **kwargs: Any) -> Any:
        raise RuntimeError("the trailing-slash resource builds no URLs")

    def add_prefix(self, prefix: str) -> None:
        raise RuntimeError("the trailing-slash resource takes no prefix")

    def get_info(self) -> dict[str, Any]:
        return {"prefix": PREFIX, "trailing_slash": True}

    def raw_match(self, path: str) -> bool:
        return False

    def freeze(self) -> None:
        pass

    async def resolve(self, request: web.Request) -> tuple[UrlMappingMatchInfo | None, set[str]]:
        path = request.rel_url.path
        stripped = path.rstrip("/")
        if path == stripped or not stripped.startswith(PREFIX):
            return None, set()
        found = await self._router.resolve(request.clone(rel_url=request.rel_url.with_path(stripped)))
        error = found.http_exception
        if error is None:
            return found, set()
        if isinstance(error, web.HTTPMethodNotAllowed):
            return None, set(error.allowed_methods)
        return None, set()

    def __len__(self) -> int:
        return 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())


def accept_trailing_slashes(app: web.Application) -> None:
    """Call after every route is added."""
    app.router.register_resource(TrailingSlash(app.router))
