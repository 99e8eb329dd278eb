"""A deploy run in its own process, for fault injection from outside it (signals, `kill -9`): used by
tests/test_runtime_faults.py and benchmarks/runtime_faults.py.

    python tests/runtime_child.py OUT_DIR [--robot fake|sim] [--record] [--segment_s S] [--stop_hold_s S]

Every command sent to the robot is appended to OUT_DIR/sent.log ("send p1 p2 ..."), with "connect" and
"disconnect" lines; with --record, the joint state of every observation handed to the recorder is
appended to OUT_DIR/observed.log before the recorder sees it, and the dataset goes to OUT_DIR/run. Each
line is flushed at once, so the logs survive a `kill -9`. Exits 130 after an interrupt (SIGINT, SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from test_runtime_fakes import FakeRobot, SlowSmoothPolicy

from worldloop.real_robot.deploy import DeployConfig, deploy
from worldloop.real_robot.recorder import EpisodeRecorder


class LoggedRobot:
    """Passes everything to `robot`, appending what it was told to do to `log`."""

    def __init__(self, robot, log: Path):
        self._robot, self._log = robot, log.open("a", buffering=1)

    def __getattr__(self, name):
        return getattr(self._robot, name)

    def connect(self, calibrate: bool = True) -> None:
        self._robot.connect()
        self._log.write("connect\n")

    def send_action(self, action: dict) -> dict:
        sent = self._robot.send_action(action)
        self._log.write("send " + " ".join(repr(float(v)) for v in action.values()) + "\n")
        return sent

    def disconnect(self) -> None:
        self._robot.disconnect()
        self._log.write("disconnect\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--robot", choices=("fake", "sim"), default="fake")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--segment_s", type=float, default=0.5)
    parser.add_argument("--stop_hold_s", type=float, default=1.0)
    parser.add_argument("--episode_time_s", type=float, default=60.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = DeployConfig(episode_time_s=args.episode_time_s, stop_on_success=False)
    cfg.runtime.status_every_s = 0.0
    cfg.runtime.stop_hold_s = args.stop_hold_s
    cfg.robot.image_size = 32
    if args.robot == "fake":
        robot = FakeRobot(start=np.full(4, 0.2))
    else:
        from worldloop.real_robot.robots import make_robot

        robot = make_robot(cfg.robot, cfg.runtime.control_hz)
    if args.record:
        cfg.record.root = str(out / "run")
        cfg.record.segment_s = args.segment_s
        observed = (out / "observed.log").open("a", buffering=1)
        keys = [f"{j}.pos" for j in FakeRobot().joint_names]
        record = EpisodeRecorder.on_observation

        def on_observation(self, observation, now, last_command):
            observed.write(" ".join(repr(float(observation[k])) for k in keys) + "\n")
            record(self, observation, now, last_command)

        EpisodeRecorder.on_observation = on_observation
    try:
        deploy(
            cfg,
            policy=SlowSmoothPolicy(latency_s=0.02, amplitude=3.0),
            robot=LoggedRobot(robot, out / "sent.log"),
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
