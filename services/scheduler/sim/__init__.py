"""Trace simulator: replays cluster traces through PAI's scheduler core with a virtual clock.

    from services.scheduler.sim import SimOptions, simulate_files, report_json
    result = simulate_files("philly.csv", "philly_vc.csv", SimOptions(policies=("hived", "private")))
    print(report_json(result.report))

Layers: readers/ (trace files -> Trace), cluster (cluster files -> SimCluster),
workload (window, VC matching, gang shapes -> SimJob), policies/ (the real core and
the reference models), simulator (the virtual-clock loop), metrics and plots,
runner (all of it in one call). No asyncio, NATS or wall clock anywhere here.
"""

from services.scheduler.sim.cluster import ClusterFileError, SimCluster, load_sim_cluster
from services.scheduler.sim.readers import TraceFormatError, read_trace
from services.scheduler.sim.runner import POLICIES, SimOptions, SimulationResult, report_json, simulate_files
from services.scheduler.sim.simulator import SimulationRun, simulate
from services.scheduler.sim.trace import SkippedRow, Trace, TraceJob
from services.scheduler.sim.workload import SimJob, Workload, prepare_workload

__all__ = [
    "POLICIES",
    "ClusterFileError",
    "SimCluster",
    "SimJob",
    "SimOptions",
    "SimulationResult",
    "SimulationRun",
    "SkippedRow",
    "Trace",
    "TraceFormatError",
    "TraceJob",
    "Workload",
    "load_sim_cluster",
    "prepare_workload",
    "read_trace",
    "report_json",
    "simulate",
    "simulate_files",
]
