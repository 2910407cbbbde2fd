"""Every `/api/v2/marketplace` route in one list (services/rest/market/handlers.py)."""

from __future__ import annotations

from aiohttp import web

from services.rest.market import handlers

ITEM = handlers.ITEMS + "/{item}"

ROUTES = [
    web.get(handlers.ITEMS, handlers.list_items),
    web.post(handlers.ITEMS, handlers.create_item),
    web.post("/api/v2/marketplace/import", handlers.import_item),  # one OpenPAI marketplace v2 file
    web.get(ITEM, handlers.get_item),
    web.put(ITEM, handlers.put_item),
    web.delete(ITEM, handlers.delete_item),
    web.put(ITEM + "/star", handlers.put_star),
    web.delete(ITEM + "/star", handlers.delete_star),
    web.post(ITEM + "/review", handlers.review_item),  # admins: approve or reject a public item
    web.post(ITEM + "/render", handlers.render_jobs),  # the job document(s) a template makes
    web.get(ITEM + "/export", handlers.export_item),  # as an OpenPAI marketplace v2 file
]
