"""The cluster as OpenPAI shows it, in one list: the banners, `/info`, VCs, sku types
and the Kubernetes views (services/rest/kubernetes_views.py). Nodes with their health
and cordons are PAI's (services/rest/nodes.py)."""

from __future__ import annotations

from aiohttp import web

from libs.common.errors import BadInput, Forbidden
from services.rest import jobs_api, kubernetes_views
from services.rest.request import USER

# OpenPAI's banners: `/api/v1` (and its root) answer what the server is, `/api/v2` a line of text.
V2_BANNER = "PAI RESTful API v2 (beta version)"


async def v2_banner(_: web.Request) -> web.Response:
    return web.Response(text=V2_BANNER)


class VcChangeNotImplemented(BadInput):
    """OpenPAI's answer on Kubernetes (HiveD) to a VC created, changed, stopped or removed
    over the API: 400 NotImplementedError. PAI's VCs are cells in the cluster configuration."""

    code = "NotImplementedError"


async def change_vc(request: web.Request) -> web.Response:
    caller = request[USER]
    if not caller.admin:
        raise Forbidden(f"only admins may change virtual clusters; {caller.username} is not one")
    raise VcChangeNotImplemented(
        f"virtual cluster {request.match_info['vc'][:64]!r} cannot be {request.method == 'DELETE' and 'removed' or 'changed'} "
        "over the API, as in OpenPAI with HiveD: PAI's virtual clusters are cells in the cluster configuration "
        "(cluster_file); change them there and reload it")


ROUTES = [
    web.get("/api/v2", v2_banner),
    web.get("/api/v1", jobs_api.get_info),
    web.get("/api/v2/info", jobs_api.get_info),
    web.get("/api/v2/virtual-clusters", jobs_api.list_virtual_clusters),
    web.get("/api/v2/virtual-clusters/{vc}", jobs_api.get_virtual_cluster),
    web.put("/api/v2/virtual-clusters/{vc}", change_vc),
    web.delete("/api/v2/virtual-clusters/{vc}", change_vc),
    web.put("/api/v2/virtual-clusters/{vc}/status", change_vc),
    web.get("/api/v2/virtual-clusters/{vc}/sku-types", jobs_api.get_vc_sku_types),
    web.get("/api/v2/cluster/sku-types", jobs_api.get_sku_types),
    web.get("/api/v2/kubernetes/nodes", kubernetes_views.get_nodes),
    web.get("/api/v2/kubernetes/pods", kubernetes_views.get_pods),
]
