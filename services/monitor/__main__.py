"""`python -m services.monitor [--agent | --cluster]`: the monitor service.

`--agent` runs the node agent alone (`monitor_mode: agent`, as the chart's
DaemonSet does), `--cluster` the cluster monitor alone; without either, the
configured `monitor_mode` (default `both`).
"""

import argparse

from libs.common import service
from libs.common.config import load_config
from services.monitor.service import body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.monitor")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--agent", action="store_const", const="agent", dest="mode", help="sample this node only")
    mode.add_argument("--cluster", action="store_const", const="cluster", dest="mode", help="node health, metrics, alerts")
    args = parser.parse_args(argv)
    config = load_config(**({"monitor_mode": args.mode} if args.mode else {}))
    service.run("monitor", config, body)


if __name__ == "__main__":
    main()
