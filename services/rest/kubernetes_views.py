"""OpenPAI's `/api/v2/kubernetes/nodes` and `/pods`: PAI's own knowledge of its nodes and
tasks, shaped as Kubernetes lists (a NodeList, a PodList), on either backend.

OpenPAI answers these from the Kubernetes API server; PAI answers from what it keeps:
the nodes as `GET /api/v2/cluster/nodes` shows them (already Node-shaped), and a Pod per
live task of every job not yet final (its current attempt), read from the launcher's
records. Admins only, as OpenPAI's.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from libs.common import ids
from libs.common.bus import get_json
from libs.common.errors import Forbidden
from libs.common.records import JobRecord, TaskRecord
from libs.common.subjects import Bucket
from services.rest import jobs_api, nodes
from services.rest.records import SubmittedJob
from services.rest.request import USER, ctx_of

NAMESPACE = "default"  # every task's Pod, as OpenPAI's default namespace
# A task's state as a Pod's phase.
PHASES = {"WAITING": "Pending", "RUNNING": "Running", "SUCCEEDED": "Succeeded", "FAILED": "Failed",
          "STOPPED": "Failed", "STOPPING": "Running"}
RECORDS_IN_FLIGHT = 32


def _time(at: float | None) -> str | None:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z") if at else None


def node_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "NodeList", "apiVersion": "v1", "metadata": {}, "items": items}


def pod_of(sub: SubmittedJob, rec: JobRecord, task: TaskRecord) -> dict[str, Any]:
    """One task as a Kubernetes Pod, with OpenPAI's labels (pure)."""
    role = next((r for r in sub.spec.taskRoles if r.name == task.role), None)
    limits: dict[str, str] = {}
    if role is not None:
        limits = {"cpu": str(role.resources.cpu), "memory": f"{role.resources.memoryMB}Mi",
                  nodes.GPU_RESOURCE: str(role.resources.gpu)}
    name = f"{ids.job_key(sub.job).replace('.', '-')}-{task.role}-{task.index}".lower()
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NAMESPACE, "creationTimestamp": _time(task.createdTime or None),
            "labels": {"type": "kube-launcher-task", "userName": sub.user, "virtualCluster": sub.vc,
                       "jobName": sub.name, "FC_FRAMEWORK_NAME": sub.job, "FC_TASKROLE_NAME": task.role,
                       "FC_TASK_INDEX": str(task.index)},
            "annotations": {"pai/attempt": str(rec.attempt), "pai/taskAttempt": str(task.taskAttempt)},
        },
        "spec": {"nodeName": task.node, "containers": [{"name": "main", "resources": {"limits": limits,
                                                                                       "requests": limits}}]},
        "status": {"phase": PHASES.get(task.state.value, "Unknown"), "hostIP": task.hostIp, "podIP": task.hostIp,
                   "startTime": _time(task.launchedTime)},
    }


def pod_list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}


def _require_admin(request: web.Request, what: str) -> None:
    caller = request[USER]
    if not caller.admin:
        raise Forbidden(f"only admins may list the cluster's {what} (/api/v2/kubernetes/{what}); "
                        f"{caller.username} is not one")


async def get_nodes(request: web.Request) -> web.Response:
    _require_admin(request, "nodes")
    records, view = await asyncio.gather(nodes._health_records(request), nodes._cluster_view(request))
    cells = {str(n["name"]): list(n.get("cells") or []) for n in view.nodes if n.get("name")}
    names = sorted(set(cells) | set(records))
    return jobs_api.json_response(node_list([nodes.node_view(n, records.get(n), cells.get(n), view.skuTypes)
                                             for n in names]))


async def get_pods(request: web.Request) -> web.Response:
    _require_admin(request, "pods")
    namespace = request.query.get("namespace")
    if namespace not in (None, "", NAMESPACE):
        return jobs_api.json_response(pod_list([]))  # PAI's tasks are all in one namespace
    index = request.app.get(jobs_api.INDEX)
    live = [job for job in (index.jobs.values() if index is not None else [])
            if job.status is None or not job.status.state.is_final]
    kv = await ctx_of(request).bus.kv(Bucket.JOB_STATUS)
    reading = asyncio.Semaphore(RECORDS_IN_FLIGHT)

    async def pods_of(job: Any) -> list[dict[str, Any]]:
        sub = job.record()
        async with reading:
            got = await get_json(kv, ids.job_key(sub.job), JobRecord)
        if got is None or not got[0].attempts:
            return []
        rec = got[0]
        return [pod_of(sub, rec, task) for task in rec.current.tasks]

    found = await asyncio.gather(*(pods_of(job) for job in live))
    return jobs_api.json_response(pod_list([pod for pods in found for pod in pods]))
