"""Record scripted-expert demonstrations from the MuJoCo tabletop suite into a local LeRobotDataset v3.

python record_demos.py --config configs/record/tiny.yaml
python record_demos.py --task=reach --episodes=100 --skill_range="[0.2, 1.0]" --root=outputs/datasets/mix
"""

from __future__ import annotations

import logging
import sys

from common.config import parse_cli
from data.recording import RecordingConfig, record_demos


def main(args: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = parse_cli(RecordingConfig, args)
    try:
        root = record_demos(cfg)
    except KeyboardInterrupt:
        print(f"interrupted: {cfg.root} holds the episodes completed before Ctrl-C", file=sys.stderr)
        sys.exit(130)
    print(f"wrote {root}")


if __name__ == "__main__":
    main()
