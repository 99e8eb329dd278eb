"""The control runtime with a fake robot: delay alignment, stalls, watchdog, safe stop, real-time ticking."""

from __future__ import annotations

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.deploy import DeployConfig, deploy
from worldloop.real_robot.fault_injection import FakeRobot, SlowSmoothPolicy
from worldloop.real_robot.fusion import FuserConfig, make_fuser
from worldloop.real_robot.inference import PolicyRunner, SimulatedLatencyInference
from worldloop.real_robot.runtime import ControlRuntime, RobotIO, RuntimeConfig, run_lockstep
from worldloop.real_robot.safety import SafetyLimiter, limit_violations

SPEC = TABLETOP_ARM


def _lockstep(fuser: str, latency: float, policy=None, duration=3.0, **runtime_kw):
    robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2))
    robot.connect()
    cfg = RuntimeConfig(**runtime_kw)
    fuser_obj = make_fuser(FuserConfig(name=fuser), SPEC, 1.0 / cfg.control_hz)
    policy = policy or SlowSmoothPolicy(latency_s=0.0)
    runner = PolicyRunner(policy, SPEC.joint_names, "test", use_prefix=fuser_obj.wants_prefix)
    runtime = ControlRuntime(
        RobotIO(robot, SPEC.joint_names),
        SimulatedLatencyInference(runner, lambda: latency),
        fuser_obj,
        SafetyLimiter(SPEC, 1.0 / cfg.control_hz),
        SPEC,
        cfg,
        policy_chunk_size=policy.chunk_size,
        use_prefix=runner.uses_prefix,
    )
    return runtime, run_lockstep(runtime, duration), robot


@pytest.mark.parametrize("fuser", ["naive", "rail", "temporal_ensemble", "weighted_average"])
def test_lockstep_run_measures_the_delay_and_never_stalls(fuser):
    runtime, log, robot = _lockstep(fuser, latency=0.15)
    assert len(log.switch_times) >= 5
    np.testing.assert_allclose(log.delays, 0.15, atol=1e-9)  # delay on the control clock, cold start excluded
    assert sum(log.stalled) == 0
    sent = np.array(robot.sent)
    assert len(sent) > len(log.times)  # braking ticks after the run
    np.testing.assert_allclose(sent[-1], sent[-2], atol=1e-12)  # ...that end at rest


def test_sync_schedule_stalls_while_the_policy_computes():
    _, log, _ = _lockstep("naive", latency=0.3, schedule="sync", sync_action_steps=5, duration=3.0)
    stall_s = sum(log.stalled) * 0.01
    # every 0.5 s of motion is followed by a 0.3 s wait: about 3/8 of the run after the first chunk
    assert 0.8 < stall_s < 1.3, stall_s


def test_rtc_passes_the_executing_plan_as_prefix():
    class PrefixPolicy(SlowSmoothPolicy):
        def __init__(self):
            super().__init__(latency_s=0.0)
            self.prefixes = []

        def predict_action_chunk(self, batch, prefix_actions=None, inference_delay=0):
            if prefix_actions is not None:
                self.prefixes.append((prefix_actions.clone(), inference_delay))
            return super().predict_action_chunk(batch)

    policy = PrefixPolicy()
    _, log, _ = _lockstep("rtc", latency=0.25, policy=policy)
    assert policy.prefixes, "rtc never sent a prefix"
    prefix, delay = policy.prefixes[-1]
    assert delay == 3  # 250 ms at 10 Hz -> 3 policy steps
    assert prefix.shape[0] == 1 and prefix.shape[2] == SPEC.num_joints and 1 <= prefix.shape[1] <= 10


def test_rtc_without_prefix_support_warns_and_aligns_like_naive(caplog):
    with caplog.at_level("WARNING"):
        _, log, _ = _lockstep("rtc", latency=0.1)
    assert "has none: chunks are aligned as with 'naive'" in caplog.text
    assert len(log.switch_times) >= 5


def test_realtime_deploy_with_a_hung_policy_fires_the_watchdog_and_brakes():
    policy = SlowSmoothPolicy(latency_s=0.05, hang_after=3)
    robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2))
    cfg = DeployConfig(episode_time_s=2.0)
    cfg.runtime.watchdog_timeout_s = 0.7  # chunks normally arrive every 0.5 s
    cfg.runtime.status_every_s = 0.0
    try:
        result = deploy(cfg, policy=policy, robot=robot)
    finally:
        policy.unblock.set()
    assert result.watchdog_fired == 1
    sent = np.array(robot.sent)
    velocity = np.diff(sent, axis=0) / 0.01
    assert np.allclose(velocity[-20:], 0.0, atol=1e-9)  # held still at the end
    assert not robot.is_connected


def test_an_error_mid_run_ends_in_a_safe_stop_and_disconnect():
    robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2), fail_after=50)
    cfg = DeployConfig(episode_time_s=2.0)
    cfg.runtime.status_every_s = 0.0
    with pytest.raises(OSError, match="serial bus error"):
        deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.02), robot=robot)
    assert not robot.is_connected


def test_ctrl_c_brakes_to_a_hold_then_disconnects():
    robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2), interrupt_at=80)
    cfg = DeployConfig(episode_time_s=3.0)
    cfg.runtime.status_every_s = 0.0
    with pytest.raises(KeyboardInterrupt):
        deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.02, amplitude=3.0), robot=robot)
    sent = np.array(robot.sent)
    assert 80 < len(sent) < 150  # stopped at the interrupt, not at the end of the episode
    moving = np.abs(sent[79] - sent[78]).max() / 0.01
    assert moving > 0.05  # it was moving when interrupted...
    np.testing.assert_allclose(sent[-1], sent[-2], atol=1e-12)  # ...and braked to a hold
    assert not robot.is_connected


def test_realtime_loop_keeps_its_rate_beside_inference():
    robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2))
    cfg = DeployConfig(episode_time_s=1.5)
    cfg.runtime.status_every_s = 0.0
    result = deploy(cfg, policy=SlowSmoothPolicy(latency_s=0.1), robot=robot)
    periods = np.array(result.log.periods)
    assert len(periods) >= 140
    # ~100 Hz on average (deadlines are absolute); jitter depends on machine load: benchmarked, not tested
    assert abs(np.median(periods) - 0.01) < 0.002
    assert len(result.log.delays) >= 2 and min(result.log.delays) >= 0.1  # a chunk every 0.5 s


def test_deploy_through_a_localhost_policy_server():
    import threading

    from worldloop.real_robot.policy_server import PolicyServer

    server = PolicyServer(SlowSmoothPolicy(latency_s=0.05), SPEC.joint_names, host="127.0.0.1", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host, port = server.address
        assert host == "127.0.0.1"
        robot = FakeRobot(start=np.full(SPEC.num_joints, 0.2))
        cfg = DeployConfig(episode_time_s=1.2, policy_server=f"{host}:{port}")
        cfg.runtime.status_every_s = 0.0
        result = deploy(cfg, robot=robot)
    finally:
        server.close()
    assert len(result.log.switch_times) >= 2 and min(result.log.delays) >= 0.05
    sent = np.array(robot.sent)
    assert np.max(np.abs(sent - 0.2)) > 1e-3  # the remote chunks moved the arm


def test_the_stop_moves_slowly_to_the_rest_pose_then_holds():
    rest = [0.0, 0.5, 1.0, -0.5]
    runtime, log, robot = _lockstep("rail", latency=0.1, duration=1.0, rest_pose=rest, stop_hold_s=0.2)
    sent = np.array(robot.sent)
    after = sent[len(log.times) :]  # the stop: brake, the move to rest, the hold
    np.testing.assert_allclose(after[-1], rest, atol=1e-9)
    assert np.abs(after[-20:] - after[-1]).max() < 1e-12  # 0.2 s held at rest
    velocity = np.abs(np.diff(after, axis=0)) / 0.01
    v_end = np.abs(log.commands[-1] - log.commands[-2]) / 0.01  # the brake takes as long as stopping that
    braked = int(np.max(np.ceil(v_end / (SPEC.max_acceleration() * 0.01)))) + 2
    assert np.all(velocity[braked:] <= 0.2 * SPEC.max_velocity() + 1e-9)  # rest_speed_scale 0.2
    assert limit_violations(SPEC, 0.01, np.full(SPEC.num_joints, 0.2), sent) == []


def test_a_rest_pose_outside_the_limits_is_a_named_error():
    with pytest.raises(ValueError, match=r"runtime.rest_pose must be 4 positions .* within the joint limits"):
        _lockstep("naive", latency=0.1, duration=0.1, rest_pose=[0.0, 0.0, 9.0, 0.0])
