"""`python -m services.monitor`: the monitor service."""

from libs.common import service
from libs.common.config import load_config
from services.monitor.service import body


def main() -> None:
    service.run("monitor", load_config(), body)


if __name__ == "__main__":
    main()
