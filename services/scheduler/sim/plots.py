"""PNG plots of simulation runs (matplotlib, from the `sim` extra: pip install 'pai[sim]').

- `<policy>-delay-cdf.png`: queueing-delay CDF per VC (and overall) for each policy;
- `delay-cdf.png`: queueing-delay CDF of all jobs, one line per policy;
- `jct-cdf.png`: job completion time CDF, one line per policy;
- `allocation.png`: GPUs allocated over time (interval averages), one line per policy.
"""

from __future__ import annotations

import math
from pathlib import Path

from services.scheduler.sim.simulator import OVERALL, SimulationRun
from services.scheduler.sim.workload import SimJob

_DPI = 100
_SIZE = (7.0, 4.0)


class PlotsUnavailable(RuntimeError):
    pass


def _pyplot():
    try:
        import matplotlib
    except ImportError as error:
        raise PlotsUnavailable("plots need matplotlib: pip install 'pai[sim]' (or matplotlib)") from error
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    values = sorted(values)
    count = len(values)
    return values, [(position + 1) / count for position in range(count)]


def _delays(jobs: list[SimJob], run: SimulationRun) -> list[float]:
    return [o.first_start - j.submit for j, o in zip(jobs, run.outcomes, strict=True) if o.first_start is not None]


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI, metadata={"Software": None})
    return path


def _delay_axes(axes, title: str, lowest: float = 0.0) -> None:
    axes.set_xscale("symlog", linthresh=1.0)
    axes.set_xlabel("queueing delay (s, log scale above 1 s)")
    axes.set_ylabel("fraction of jobs")
    # Most jobs often start at once: start the y axis near the share of zero delays so the tail shows.
    axes.set_ylim(max(0.0, math.floor(lowest * 20) / 20 - 0.05), 1.005)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)


def write_plots(out_dir: Path, jobs: list[SimJob], runs: dict[str, SimulationRun], *, total_gpus: int,
                vcs: list[str]) -> list[Path]:
    pyplot = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, run in runs.items():
        figure, axes = pyplot.subplots(figsize=_SIZE)
        lowest = 1.0
        for vc in vcs:
            delays = [o.first_start - j.submit for j, o in zip(jobs, run.outcomes, strict=True)
                      if j.vc == vc and o.first_start is not None]
            if delays:
                xs, ys = _cdf(delays)
                lowest = min(lowest, _zero_share(xs, ys))
                axes.step(xs, ys, where="post", label=vc, linewidth=1)
        axes.step(*_cdf(_delays(jobs, run)), where="post", label="all", color="black", linewidth=2)
        _delay_axes(axes, f"queueing delay per VC: {name}", lowest)
        axes.legend(fontsize="x-small", ncol=2, loc="lower right")
        written.append(_save(figure, out_dir / f"{name}-delay-cdf.png"))
        pyplot.close(figure)
    written.append(delay_cdf_plot(out_dir / "delay-cdf.png", jobs, runs))
    figure, axes = pyplot.subplots(figsize=_SIZE)
    for name, run in runs.items():
        jcts = [o.finish - j.submit for j, o in zip(jobs, run.outcomes, strict=True) if o.finish is not None]
        if jcts:
            axes.step(*_cdf(jcts), where="post", label=name)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (s)")
    axes.set_ylabel("fraction of jobs")
    axes.set_title("job completion time")
    axes.grid(True, alpha=0.3)
    axes.legend()
    written.append(_save(figure, out_dir / "jct-cdf.png"))
    pyplot.close(figure)
    figure, axes = pyplot.subplots(figsize=_SIZE)
    for name, run in runs.items():
        tracker = run.allocation
        buckets = int((run.end - run.origin) // tracker.interval) + 1
        means = tracker.mean_gpus(OVERALL, buckets)
        days = [(index + 0.5) * tracker.interval / 86400 for index in range(buckets)]
        axes.plot(days, means, label=name, linewidth=1)
    axes.axhline(total_gpus, color="grey", linestyle="--", linewidth=1, label=f"{total_gpus} GPUs")
    axes.set_xlabel("days since the first submission")
    axes.set_ylabel("GPUs allocated (interval average)")
    axes.set_title("allocated GPUs over time")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")
    written.append(_save(figure, out_dir / "allocation.png"))
    pyplot.close(figure)
    return written


def _zero_share(xs: list[float], ys: list[float]) -> float:
    """The CDF's value at delay 0 (the share of jobs that started at once)."""
    share = 0.0
    for x, y in zip(xs, ys, strict=True):
        if x > 0:
            break
        share = y
    return share


def _delay_lines(axes, jobs: list[SimJob], runs: dict[str, SimulationRun]) -> float:
    lowest = 1.0
    for name, run in runs.items():
        delays = _delays(jobs, run)
        if delays:
            xs, ys = _cdf(delays)
            lowest = min(lowest, _zero_share(xs, ys))
            axes.step(xs, ys, where="post", label=name)
    return lowest


def delay_cdf_plot(path: Path, jobs: list[SimJob], runs: dict[str, SimulationRun], *, title: str = "") -> Path:
    """Queueing-delay CDF of all jobs, one line per policy."""
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(figsize=_SIZE)
    lowest = _delay_lines(axes, jobs, runs)
    _delay_axes(axes, title or "queueing delay, all jobs", lowest)
    axes.legend(loc="lower right")
    path = _save(figure, path)
    pyplot.close(figure)
    return path


def delay_cdf_panels(path: Path, panels: list[tuple[str, list[SimJob], dict[str, SimulationRun]]]) -> Path:
    """Side by side queueing-delay CDFs (e.g. the same trace at two loads), one line per policy."""
    pyplot = _pyplot()
    figure, all_axes = pyplot.subplots(1, len(panels), figsize=(5.0 * len(panels), 3.8), squeeze=False)
    for axes, (title, jobs, runs) in zip(all_axes[0], panels, strict=True):
        lowest = _delay_lines(axes, jobs, runs)
        _delay_axes(axes, title, lowest)
        axes.legend(loc="lower right", fontsize="small")
    path = _save(figure, path)
    pyplot.close(figure)
    return path
