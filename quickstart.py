"""Run the whole worldloop loop on the tiny configs and write outputs/<run>/report.html.

python quickstart.py                 # the full loop (target: <= 45 minutes on 2 CPU cores)
python quickstart.py --fast=true     # a first look (target: <= 10 minutes)
python quickstart.py --force=true    # redo stages whose outputs exist
"""

from __future__ import annotations

from worldloop.common.config import parse_cli
from worldloop.pipelines.quickstart import QuickstartConfig, run_quickstart


def main(args: list[str] | None = None) -> None:
    run_quickstart(parse_cli(QuickstartConfig, args))


if __name__ == "__main__":
    main()
