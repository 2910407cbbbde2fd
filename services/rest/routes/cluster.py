"""The cluster as OpenPAI shows it, in one list: the banners, `/info`, VCs, sku types
and the Kubernetes views (services/rest/kubernetes_views.py). Nodes with their health
and cordons are PAI's (services/rest/nodes.py)."""

from __future__ import annotations

from aiohttp import web

from services.rest import jobs_api, kubernetes_views

# OpenPAI's banners: `/api/v1` (and its root) answer what the server is, `/api/v2` a line of text.
V2_BANNER = "PAI RESTful API v2 (beta version)"


async def v2_banner(_: web.Request) -> web.Response:
    return web.Response(text=V2_BANNER)


ROUTES = [
    web.get("/api/v2", v2_banner),
    web.get("/api/v1", jobs_api.get_info),
    web.get("/api/v2/info", jobs_api.get_info),
    web.get("/api/v2/virtual-clusters", jobs_api.list_virtual_clusters),
    web.get("/api/v2/virtual-clusters/{vc}", jobs_api.get_virtual_cluster),
    web.get("/api/v2/virtual-clusters/{vc}/sku-types", jobs_api.get_vc_sku_types),
    web.get("/api/v2/cluster/sku-types", jobs_api.get_sku_types),
    web.get("/api/v2/kubernetes/nodes", kubernetes_views.get_nodes),
    web.get("/api/v2/kubernetes/pods", kubernetes_views.get_pods),
]
