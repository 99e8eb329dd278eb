"""Deploy a policy on a simulated or real robot: async inference, chunk fusion, safety, optional recording.

    python deploy.py --config configs/deploy/tiny.yaml --policy_path outputs/policy/pretrained_model
    python deploy.py --robot.type=so101_follower --robot.port=/dev/ttyACM0 --policy_path ... \\
        --instruction="push the red cube" --fuser.name=rail --runtime.control_hz=100
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from lerobot.robots import RobotConfig

from worldloop.real_robot.fusion import FuserConfig, make_fuser
from worldloop.real_robot.helpers import check_number, check_policy_path, load_policy
from worldloop.real_robot.inference import PolicyRunner, ThreadedInference
from worldloop.real_robot.policy_server import TOKEN_ENV, RemotePolicyClient, start_server_process
from worldloop.real_robot.recorder import EpisodeRecorder, RecordConfig
from worldloop.real_robot.robots import EMBODIMENTS, SimRobotConfig, embodiment_for, make_robot
from worldloop.real_robot.runtime import (
    ControlRuntime,
    RobotIO,
    RunLog,
    RuntimeConfig,
    interrupts_deferred,
    run_realtime,
    terminate_as_interrupt,
)
from worldloop.real_robot.safety import SafetyConfig, SafetyLimiter, TrackingGuard

logger = logging.getLogger(__name__)


@dataclass
class DeployConfig:
    robot: RobotConfig = field(default_factory=SimRobotConfig)  # --robot.type=sim | so101_follower | ...
    policy_path: str | None = None  # pretrained policy directory (config.yaml, model.safetensors, stats.json)
    # HOST:PORT of `python -m worldloop.real_robot.policy_server` (then no policy_path)
    policy_server: str | None = None
    inference: str = "thread"  # thread | process (policy_path served by a child process: no shared GIL)
    instruction: str | None = None  # language instruction; default: the sim robot's task
    episode_time_s: float = 20.0
    stop_on_success: bool = True  # end early when the robot reports task success (sim)
    inference_threads: int = 1  # torch threads for the policy; the other cores stay with the control loop
    fuser: FuserConfig = field(default_factory=FuserConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    safety: SafetyConfig = field(default_factory=SafetyConfig)
    record: RecordConfig = field(default_factory=RecordConfig)

    def __post_init__(self) -> None:
        check_number("episode_time_s", self.episode_time_s, low=0.0, low_open=True)
        check_number("inference_threads", self.inference_threads, low=1, integer=True)
        if self.inference not in ("thread", "process"):
            raise ValueError(f"inference must be 'thread' or 'process', got {self.inference!r}")


@dataclass
class DeployResult:
    log: RunLog
    success: bool
    dataset_root: Path | None
    rejections: dict[str, int]
    watchdog_fired: int


def deploy(cfg: DeployConfig, policy=None, robot=None) -> DeployResult:
    """Run one episode. `policy` and `robot` default to what `cfg` names (tests pass their own)."""
    spec = embodiment_for(cfg.robot)
    tracking = TrackingGuard(spec, cfg.safety)
    server_process, server_address = None, cfg.policy_server
    if policy is None and server_address is None:
        if cfg.inference == "process":
            check_policy_path(cfg.policy_path)
            robot_type = cfg.robot.type if cfg.robot.type in EMBODIMENTS else "sim"
            server_process, server_address = start_server_process(
                cfg.policy_path, robot_type, cfg.inference_threads
            )
        else:
            policy = load_policy(cfg.policy_path)
    if policy is not None:
        policy.eval()
        policy.reset()
    robot = robot if robot is not None else make_robot(cfg.robot, cfg.runtime.control_hz)
    torch.set_num_threads(cfg.inference_threads)
    fuser = make_fuser(cfg.fuser, spec, 1.0 / cfg.runtime.control_hz)
    safety = SafetyLimiter(spec, 1.0 / cfg.runtime.control_hz, cfg.safety)
    success_check = getattr(robot, "task_success", None)

    with terminate_as_interrupt():  # `kill` stops like Ctrl-C: brake, hold, then disconnect
        robot.connect()
        inference, recorder, runner, runtime = None, None, None, None
        success = False
        try:
            instruction = cfg.instruction or getattr(robot, "task", None) or ""  # the sim knows its task
            if not instruction:
                logger.warning(
                    "no --instruction given and the robot has no task: the policy gets an empty one"
                )
            if policy is not None:
                runner = PolicyRunner(policy, spec.joint_names, instruction, use_prefix=fuser.wants_prefix)
                chunk_size, use_prefix = int(policy.chunk_size), runner.uses_prefix
            else:
                token = os.environ.get(TOKEN_ENV) or None  # the server's shared token, if it has one
                runner = RemotePolicyClient(server_address, instruction, token=token)
                chunk_size, use_prefix = runner.chunk_size, fuser.wants_prefix and runner.uses_prefix
            if cfg.record.root is not None:
                recorder = EpisodeRecorder(
                    cfg.record, spec.joint_names, spec.fps, instruction, cfg.robot.type
                )
            io = RobotIO(robot, spec.joint_names)
            inference = ThreadedInference(runner)
            runtime = ControlRuntime(
                io,
                inference,
                fuser,
                safety,
                spec,
                cfg.runtime,
                policy_chunk_size=chunk_size,
                use_prefix=use_prefix,
                on_observation=recorder.on_observation if recorder else None,
                tracking=tracking,
            )
            runtime.warm_up(runner)

            ticks_per_frame = max(1, int(round(cfg.runtime.control_hz / spec.fps)))

            def done() -> bool:  # checked at the policy rate: the success test reads the whole scene
                nonlocal success
                if (
                    success_check is not None
                    and cfg.stop_on_success
                    and len(runtime.log.times) % ticks_per_frame == 0
                ):
                    success = bool(success_check())
                return success

            log = run_realtime(runtime, cfg.episode_time_s, stop=done)
            if success_check is not None:
                success = bool(success_check())
        finally:
            with interrupts_deferred("disconnecting and saving the recording"):
                if inference is not None:
                    inference.close()
                if isinstance(runner, RemotePolicyClient):
                    runner.close()
                if server_process is not None:
                    server_process.terminate()
                    server_process.join(timeout=5.0)
                try:
                    robot.disconnect()
                finally:  # a failed disconnect must not lose the recording
                    dataset_root = None
                    if recorder is not None:
                        last = safety.state.position if safety.started else np.zeros(spec.num_joints)
                        dataset_root = recorder.finish(last, success)
    _report(log, safety, runtime)
    return DeployResult(log, success, dataset_root, dict(safety.rejections), runtime.watchdog.fired_count)


def _report(log: RunLog, safety: SafetyLimiter, runtime: ControlRuntime) -> None:
    periods = np.asarray(log.periods)
    jitter = np.abs(periods - runtime.control_dt) * 1e3 if len(periods) else np.array([np.nan])
    delays = np.asarray(log.delays) * 1e3 if log.delays else np.array([np.nan])
    logger.info(
        "ran %.1fs: %d chunks, inference delay p50 %.0f ms, period jitter p50 %.3f / p99 %.3f ms, "
        "overruns %d, stall %.2fs, watchdog %d, rejected %s",
        len(log.times) * runtime.control_dt,
        len(log.switch_times),
        np.percentile(delays, 50),
        np.percentile(jitter, 50),
        np.percentile(jitter, 99),
        log.overruns,
        sum(log.stalled) * runtime.control_dt,
        runtime.watchdog.fired_count,
        safety.rejections or "none",
    )
