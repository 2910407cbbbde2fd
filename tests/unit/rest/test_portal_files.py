"""The portal's files as rest serves them (services/rest/portal_routes.py): the page at /,
its modules with a JavaScript type, revalidation, the security headers, and nothing
outside the portal's folder."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from libs.common.errors import PaiError
from services.rest import portal_routes


@web.middleware
async def errors_as_json(request, handler):  # what rest's error middleware does, in short
    try:
        return await handler(request)
    except PaiError as exc:
        return web.json_response({"code": exc.code, "message": exc.message}, status=exc.status)


@pytest.fixture
async def client():
    app = web.Application(middlewares=[errors_as_json])
    portal_routes.setup(app)
    async with TestClient(TestServer(app)) as c:
        yield c


async def test_the_page_is_served_at_the_root_with_its_security_headers(client):
    resp = await client.get("/")
    assert resp.status == 200
    assert resp.content_type == "text/html"
    assert '<script type="module" src="/portal/js/main.js">' in await resp.text()
    assert "script-src 'self'" in resp.headers["Content-Security-Policy"]
    assert resp.headers["X-Frame-Options"] == "DENY"


@pytest.mark.parametrize("path", ["/portal/js/main.js", "/portal/js/pages/submit.js", "/portal/theme.js",
                                  "/portal/vendor/js-yaml/js-yaml.js"])
async def test_modules_are_served_as_javascript(client, path):
    resp = await client.get(path)
    assert resp.status == 200
    assert resp.content_type == "text/javascript"


async def test_an_unchanged_file_is_revalidated_not_sent_again(client):
    first = await client.get("/portal/portal.css")
    assert first.status == 200 and first.headers["Cache-Control"] == "no-cache"
    again = await client.get("/portal/portal.css", headers={"If-None-Match": first.headers["ETag"]})
    assert again.status == 304


# The encoded slashes reach the handler as "../" (services/rest/portal_routes.py and app.py exist).
@pytest.mark.parametrize("path", ["/portal/nothing.js", "/portal/..%2F..%2Fportal_routes.py",
                                  "/portal/js/..%2F..%2F..%2Fapp.py", "/portal/js"])
async def test_nothing_outside_the_portal_folder_is_served(client, path):
    resp = await client.get(URL(path, encoded=True))
    assert resp.status == 404
    assert (await resp.json())["code"]


def test_every_file_the_page_names_exists():
    page = (portal_routes.STATIC_DIR / "index.html").read_text()
    for name in ("portal.css", "theme.js", "js/main.js", "favicon.svg"):
        assert f"/portal/{name}" in page
        assert (portal_routes.STATIC_DIR / name).is_file()
