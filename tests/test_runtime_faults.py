"""Fault injection on the deploy runtime: a second interrupt during the stop, SIGTERM, a blocked joint that
is freed, `kill -9` of a recording run, a disconnect that fails. The arm must stay within its limits,
end held, and the recording must keep what was saved."""

from __future__ import annotations

import json
import logging
import os
import signal
import time

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.features import STATE
from worldloop.data.recording import RECORDING_META, repair_recording
from worldloop.real_robot.deploy import DeployConfig, deploy
from worldloop.real_robot.fault_injection import (
    FakeRobot,
    SlowSmoothPolicy,
    count_sends,
    read_sends,
    run_blocked,
    saved_segments,
    start_child,
    wait_for,
)
from worldloop.real_robot.safety import SafetyStop, limit_violations

SPEC = TABLETOP_ARM
DT = 0.01


# ---- stop ----------------------------------------------------------------------------------------------
class InterruptedTwice(FakeRobot):
    """A real signal at send `first`, then another a few sends into the stop."""

    def __init__(self, first: int, signum: int, **kw):
        super().__init__(start=np.full(SPEC.num_joints, 0.2), **kw)
        self.at, self.signum = (first, first + 5), signum

    def send_action(self, action: dict) -> dict:
        if len(self.sent) in self.at:
            os.kill(os.getpid(), self.signum)
        return super().send_action(action)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_interrupt_during_the_stop_does_not_cut_it_short(caplog, signum):
    robot = InterruptedTwice(first=80, signum=signum)
    cfg = DeployConfig(episode_time_s=5.0)
    cfg.runtime.status_every_s, cfg.runtime.stop_hold_s = 0.0, 0.3
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.02, amplitude=3.0), robot=robot)
    sent = np.array(robot.sent)
    assert f"{signal.Signals(signum).name}: the safe stop must finish first" in caplog.text
    assert len(sent) >= 80 + 30  # the brake, then all 30 ticks of the hold
    assert np.abs(sent[-30:] - sent[-1]).max() < 1e-12  # held still with torque on...
    assert not robot.is_connected  # ...then disconnected
    assert limit_violations(SPEC, DT, np.full(SPEC.num_joints, 0.2), sent) == []


@pytest.mark.slow  # ~20 s: a child process imports the deploy stack; the in-process test above is fast
def test_sigterm_stops_like_ctrl_c_and_a_ctrl_c_during_that_stop_is_held_back(tmp_path):
    log = tmp_path / "sent.log"
    child = start_child(tmp_path, "--stop_hold_s=1.0")
    try:
        wait_for(lambda: count_sends(log) >= 100, 120, "the child to run 1 s")
        child.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # inside the stop (the hold alone lasts 1 s)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=60)
    finally:
        child.kill()
    assert child.returncode == 130, stderr
    assert "SIGINT: the safe stop must finish first" in stderr
    sent = read_sends(log)
    assert log.read_text().splitlines()[-1] == "disconnect"
    assert np.abs(sent[-100:] - sent[-1]).max() < 1e-12  # 1 s held with torque on
    assert limit_violations(SPEC, DT, np.full(SPEC.num_joints, 0.2), sent) == []


# ---- tracking guard ------------------------------------------------------------------------------------
def test_a_blocked_then_freed_joint_trips_the_tracking_guard_and_never_jumps(caplog):
    with caplog.at_level(logging.ERROR, logger="worldloop.real_robot.runtime"):
        robot, runtime, stop = run_blocked(tracking_margin=0.1)
    assert isinstance(stop, SafetyStop) and "shoulder_pitch measured at" in str(stop)
    assert "safety stop: tracking: shoulder_pitch" in caplog.text and runtime.log.stop_reason == str(stop)
    measured = np.array(robot.measured)
    assert len(measured) < 150  # stopped (and held where the arm was) before the joint came free
    assert np.max(np.abs(np.diff(measured, axis=0))) <= SPEC.max_velocity().max() * DT + 1e-9

    unguarded, _, stop = run_blocked(tracking_margin=None)  # the same fault without the guard
    jumps = np.abs(np.diff(np.array(unguarded.measured)[:, 1]))
    assert stop is None and jumps.max() > 1.0  # freed: a 1 rad jump in one tick


# ---- recording under crashes --------------------------------------------------------------------------
@pytest.mark.slow  # ~20 s: a child process (benchmarks/runtime_faults.py repeats it)
def test_kill_9_of_a_recording_run_keeps_every_frame_up_to_the_last_save(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = tmp_path / "run"
    child = start_child(tmp_path, "--record", "--segment_s=0.5")
    try:
        wait_for(lambda: saved_segments(root) >= 3, 120, "three saved segments")
        time.sleep(0.25)  # anywhere in the next segment
    finally:
        child.kill()  # SIGKILL: no handler, no finally
        child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    repair_recording(root)  # no-op unless the kill hit a save
    recording = json.loads((root / RECORDING_META).read_text())
    assert recording["complete"] is False
    ds = LeRobotDataset("local/deploy_runs", root=root)
    saved = sum(e["length"] for e in recording["episodes"])
    assert ds.num_episodes == len(recording["episodes"]) >= 3 and ds.num_frames == saved
    observed = np.loadtxt(tmp_path / "observed.log", ndmin=2)
    states = np.stack([ds[i][STATE].numpy() for i in range(ds.num_frames)])
    np.testing.assert_allclose(states, observed[:saved], atol=1e-6)  # every frame, in order
    lost = len(observed) - 1 - saved  # the last observation still waits for its action
    assert 0 <= lost <= 2 * 5  # the segment in progress (5 frames), and what came while one was saved


class DisconnectFails(FakeRobot):
    def disconnect(self) -> None:
        super().disconnect()
        raise OSError("fake robot: bus error while disabling torque")


def test_the_recording_is_finished_when_disconnect_raises(tmp_path):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    cfg = DeployConfig(episode_time_s=1.0)
    cfg.runtime.status_every_s, cfg.runtime.stop_hold_s = 0.0, 0.0
    cfg.record.root = str(tmp_path / "run")
    with pytest.raises(OSError, match="while disabling torque"):
        deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.02), robot=DisconnectFails(start=np.full(4, 0.2)))
    recording = json.loads((tmp_path / "run" / RECORDING_META).read_text())
    assert recording["complete"] is True
    assert LeRobotDataset("local/deploy_runs", root=tmp_path / "run").num_frames >= 10
