"""OpenAPI fragment: the web portal's page and files, and the summaries its pages read
(services/rest/portal_routes.py)."""

from __future__ import annotations

from typing import Any

from services.rest.openapi.common import json_content, operation, path_param

_PORTAL = ["portal"]
_HTML = {"text/html": {"schema": {"type": "string"}}}
_FILE = {"*/*": {"schema": {"type": "string"}}}
_ROW = {"type": "object", "description": "a job list row, as GET /api/v2/jobs"}
_CELLS = {"type": "object", "properties": {
    "sku": {"type": "string"}, "gpusPerCell": {"type": "integer"}, "guaranteed": {"type": "integer"},
    "used": {"type": "integer"}, "opportunistic": {"type": "integer"}, "free": {"type": "integer"},
    "total": {"type": "integer"}, "unhealthy": {"type": "integer"}, "gpusUsed": {"type": "integer"},
    "gpusFree": {"type": "integer"}}}

SCHEMAS: dict[str, Any] = {
    "PortalOverview": {
        "type": "object",
        "description": "Home: cells and GPUs per VC and sku, jobs by state, the caller's recent jobs, firing alerts "
                       "(admins: all; others: about their jobs).",
        "properties": {
            "user": {"type": "object"},
            "virtualClusters": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string"}, "queued": {"type": "integer"}, "running": {"type": "integer"},
                "skus": {"type": "array", "items": _CELLS}}}},
            "jobsByState": {"type": "object", "additionalProperties": {"type": "integer"}},
            "totalJobs": {"type": "integer"},
            "myRecentJobs": {"type": "array", "items": _ROW},
            "firingAlerts": {"type": "array", "items": {"type": "object"}},
            "firingCount": {"type": "integer"},
        },
        "required": ["virtualClusters", "jobsByState", "totalJobs", "myRecentJobs", "firingAlerts", "firingCount"],
    },
    "PortalUtilization": {
        "type": "object",
        "description": "Each node's latest sample from the monitor (GPUs, CPU, memory) and its cells.",
        "properties": {"nodes": {"type": "array", "items": {"type": "object"}}, "cells": {"type": "object"},
                       "skuTypes": {"type": "object"}},
        "required": ["nodes", "cells", "skuTypes"],
    },
    "PortalQueue": {
        "type": "object",
        "description": "A VC's waiting jobs in queue order (priority, then submission), each with why it waits.",
        "properties": {"vc": {"type": "string"}, "count": {"type": "integer"},
                       "jobs": {"type": "array", "items": _ROW}},
        "required": ["vc", "count", "jobs"],
    },
}

PATHS: dict[str, Any] = {
    "/": {"get": operation("The web portal (sign in there; the page calls this API)", tags=_PORTAL, public=True,
                           ok={"200": {"description": "the portal's page", "content": _HTML}})},
    "/portal/{path}": {"get": operation("The portal's scripts, styles and icons", tags=_PORTAL, public=True, fails=(404,),
                                        params=[path_param("path", "a file of the portal")],
                                        ok={"200": {"description": "the file", "content": _FILE}})},
    "/api/v2/portal/overview": {"get": operation(
        "The cluster at a glance, for the portal's home", tags=_PORTAL,
        ok={"200": {"description": "overview", "content": json_content({"$ref": "#/components/schemas/PortalOverview"})}})},
    "/api/v2/portal/utilization": {"get": operation(
        "Nodes' latest GPU, CPU and memory use, for the portal's heat map", tags=_PORTAL,
        ok={"200": {"description": "samples", "content": json_content({"$ref": "#/components/schemas/PortalUtilization"})}})},
    "/api/v2/portal/queue/{vc}": {"get": operation(
        "A VC's queue in order, each job with its waiting reason", tags=_PORTAL, fails=(404,),
        params=[path_param("vc", "virtual cluster name")],
        ok={"200": {"description": "the queue", "content": json_content({"$ref": "#/components/schemas/PortalQueue"})}})},
}
