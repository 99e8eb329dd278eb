"""Deploy a policy on a simulated or real (LeRobot) robot, ROS-free. See `real_robot/deploy.py`.

    python deploy.py --config configs/deploy/tiny.yaml --policy_path outputs/policy/pretrained_model
    python deploy.py --robot.type=so101_follower --robot.port=/dev/ttyACM0 --policy_path DIR \\
        --instruction="push the red cube"
"""

from __future__ import annotations

import logging
import sys

from worldloop.common.config import parse_cli


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from worldloop.real_robot.deploy import DeployConfig, deploy
    from worldloop.real_robot.safety import SafetyStop

    cfg = parse_cli(DeployConfig)
    try:
        result = deploy(cfg)
    except KeyboardInterrupt:
        logging.getLogger("deploy").warning("interrupted: the arm was braked to a hold and disconnected")
        sys.exit(130)
    except SafetyStop as e:
        logging.getLogger("deploy").error("safety stop (the arm was held, then disconnected): %s", e)
        sys.exit(3)
    print(f"success={result.success} dataset={result.dataset_root}")


if __name__ == "__main__":
    main()
