"""Chunk fusion under inference latency: open loop, closed loop in the sim, and real control-period jitter.

OMP_NUM_THREADS=1 MUJOCO_GL=egl python benchmarks/chunk_fusion.py --jitter_sim
OMP_NUM_THREADS=1 MUJOCO_GL=egl python benchmarks/chunk_fusion.py --parts closed --task reach \
    --policy_path outputs/bench/policy_bc/180ep/pretrained_model --episodes 6 --episode_s 5 \
    --result_name chunk_fusion_vla

- open loop: a synthetic chunking policy samples a smooth reference trajectory with a per-chunk offset
  (chunks that disagree, as sampled VLA chunks do) and per-action noise; inference latency is drawn around
  50 / 150 / 300 ms with jitter and applied on the control clock (lock-step, deterministic). For every
  fuser: jerk RMS, the largest velocity and acceleration jump at chunk switches, stall time and the RMS
  tracking error to the reference (the policy's intended trajectory). `sync` is the blocking baseline.
- closed loop: a MuJoCo task through `SimRobot` at 100 Hz lock-step with the same latencies. The policy is
  the scripted expert wrapped as a chunking policy (its `rtc` variant inpaints the executing prefix like
  the VLA's RTC), or with `--policy_path` a trained policy. Success rate and time to success per fuser.
- jitter: the real-time loop at 100 Hz in wall-clock time beside a CPU-bound inference thread (or a
  policy-server process), measured with time.perf_counter; the machine's load average is recorded with it.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.embodiment import TABLETOP_ARM  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.real_robot.fusion import FuserConfig, make_fuser  # noqa: E402
from worldloop.real_robot.inference import (  # noqa: E402
    InferenceRequest,
    PolicyRunner,
    SimulatedLatencyInference,
    ThreadedInference,
)
from worldloop.real_robot.runtime import ControlRuntime, RobotIO, RuntimeConfig, run_lockstep, run_realtime  # noqa: E402
from worldloop.real_robot.safety import SafetyLimiter  # noqa: E402

SPEC = TABLETOP_ARM
SPIN_S = RuntimeConfig.spin_s  # set from --spin_s
MODES = ("sync", "naive", "temporal_ensemble", "weighted_average", "rail", "rtc")


# ---- policies ---------------------------------------------------------------------------------------
def inpaint_prefix(actions: np.ndarray, request: InferenceRequest) -> np.ndarray:
    """RTC's guidance weights on a finished chunk: the first `delay` actions follow the prefix exactly,
    the rest of the prefix with a weight decaying to zero (the soft mask of Black et al., 2025)."""
    if request.prefix is None or len(request.prefix) == 0:
        return actions
    prefix, d = request.prefix, min(request.inference_delay, len(request.prefix))
    n = len(prefix)
    k = np.arange(n)
    c = np.clip((n - k) / (n - d + 1), 0.0, 1.0)
    w = np.where(k < d, 1.0, c * (np.exp(c) - 1) / (np.e - 1))[:, None]
    out = actions.copy()
    out[:n] = w * prefix + (1 - w) * actions[:n]
    return out


class SyntheticChunkPolicy:
    """Chunks of a smooth reference with a per-chunk offset and per-action noise (open loop)."""

    def __init__(self, seed: int, chunk_size: int, inpaint: bool, offset_std=0.03, noise_std=0.01):
        rng = np.random.default_rng(seed)
        self.rng = np.random.default_rng(seed + 1)
        self.chunk_size, self.inpaint = chunk_size, inpaint
        self.offset_std, self.noise_std = offset_std, noise_std
        mid = 0.5 * (SPEC.lower() + SPEC.upper())
        # two sines per joint at 0.2-0.5 Hz, well inside the velocity and acceleration limits
        self.freq = rng.uniform(0.2, 0.5, (2, SPEC.num_joints))
        self.phase = rng.uniform(0, 2 * np.pi, (2, SPEC.num_joints))
        self.amp = 0.15 * (SPEC.upper() - SPEC.lower()) * rng.uniform(0.5, 1.0, (2, SPEC.num_joints)) / 2
        self.mid = mid

    def reference(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)[..., None, None]
        return self.mid + (self.amp * np.sin(2 * np.pi * self.freq * t + self.phase)).sum(-2)

    def __call__(self, request: InferenceRequest) -> np.ndarray:
        t = request.obs_time + (np.arange(self.chunk_size) + 1) / SPEC.fps
        offset = self.rng.normal(0, self.offset_std, (1, SPEC.num_joints))
        noise = self.rng.normal(0, self.noise_std, (self.chunk_size, SPEC.num_joints))
        actions = self.reference(t) + offset + noise
        return inpaint_prefix(actions, request) if self.inpaint else actions


class ExpertChunkPolicy:
    """The scripted expert as a chunking policy. For each chunk it plays `chunk_size` steps closed loop in a
    copy of the simulator started from the robot's state at the observation (a perfect world model) and
    returns those actions. Its internal plan is restored to the step being executed at the observation,
    so consecutive chunks continue one plan, as a well-trained policy's would."""

    def __init__(self, robot, chunk_size: int, inpaint: bool, sync_steps: int | None):
        from worldloop.sim.experts import ExpertConfig, ScriptedExpert
        from worldloop.sim.tabletop_env import TabletopEnv, TabletopEnvConfig

        self.robot = robot
        self.scratch = TabletopEnv(TabletopEnvConfig(task=robot.config.task, cameras=()))
        self.expert = ScriptedExpert(self.scratch, ExpertConfig(skill=1.0))
        self.chunk_size, self.inpaint, self.sync_steps = chunk_size, inpaint, sync_steps
        self._snapshots: list[dict] = []
        self._last_obs_time: float | None = None

    def reset(self, seed: int) -> None:
        self.scratch.reset(seed=seed)  # the same layout and task as the robot's episode (same seed)
        self.expert.reset(seed=seed)
        self._snapshots, self._last_obs_time = [self._snapshot()], None

    def _snapshot(self) -> dict:
        return {k: copy.deepcopy(v) for k, v in vars(self.expert).items() if k not in ("env", "config")}

    def __call__(self, request: InferenceRequest) -> np.ndarray:
        import mujoco

        if self._last_obs_time is not None:
            steps = (request.obs_time - self._last_obs_time) * SPEC.fps
            done = self.sync_steps if self.sync_steps is not None else int(np.floor(steps + 1e-6))
            vars(self.expert).update(copy.deepcopy(self._snapshots[min(done, len(self._snapshots) - 1)]))
        self._last_obs_time = request.obs_time
        real, model = self.robot.env.sim, self.scratch.sim
        mujoco.mj_copyData(model.data, model.model, real.data)
        model.target = real.target.copy()
        self._snapshots = [self._snapshot()]
        actions = []
        for _ in range(self.chunk_size):
            action = self.expert.act().astype(np.float64)
            model.set_target(action)
            model.advance(1.0 / SPEC.fps)
            actions.append(action)
            self._snapshots.append(self._snapshot())
        actions = np.stack(actions)
        return inpaint_prefix(actions, request) if self.inpaint else actions

    def close(self) -> None:
        self.scratch.close()


class IdealArm:
    """A robot that is exactly where it was last commanded (open loop and jitter runs)."""

    def __init__(self, cameras: tuple[str, ...] = (), image_size: int = 64):
        self.q = 0.5 * (SPEC.lower() + SPEC.upper())
        self.cameras, self.image_size = cameras, image_size

    def get_observation(self) -> dict:
        obs = {f"{j}.pos": float(v) for j, v in zip(SPEC.joint_names, self.q)}
        for cam in self.cameras:
            obs[cam] = np.zeros((self.image_size, self.image_size, 3), dtype=np.uint8)
        return obs

    def send_action(self, action: dict) -> dict:
        self.q = np.array([action[f"{j}.pos"] for j in SPEC.joint_names])
        return action


# ---- metrics ----------------------------------------------------------------------------------------
def motion_metrics(log, control_dt: float, reference=None) -> dict:
    commands, times = np.array(log.commands), np.array(log.times)
    first = int(np.searchsorted(times, log.switch_times[0])) if log.switch_times else 0
    c = commands[first:]
    v = np.diff(c, axis=0) / control_dt  # v[k]: interval k -> k+1
    a = np.diff(v, axis=0) / control_dt
    jerk = np.diff(a, axis=0) / control_dt
    vel_jumps, acc_jumps = [], []
    for s in log.switch_times[1:]:
        i = int(np.searchsorted(times, s)) - first  # first command computed with the new chunk
        if 2 <= i < len(a) - 1:
            vel_jumps.append(np.max(np.abs(v[i] - v[i - 1])))  # velocity into vs out of the switch tick
            acc_jumps.append(np.max(np.abs(np.stack([a[i] - a[i - 1], a[i - 1] - a[i - 2]]))))
    raw = np.array(log.targets)[first:]  # the fuser's output before the safety layer limited it
    raw_jerk = np.diff(raw, n=3, axis=0) / control_dt**3
    out = {
        "jerk_rms": float(np.sqrt(np.mean(jerk**2))),
        "fuser_jerk_rms": float(np.sqrt(np.mean(raw_jerk**2))),
        "max_vel_jump": float(max(vel_jumps, default=0.0)),
        "max_acc_jump": float(max(acc_jumps, default=0.0)),
        "stall_s": float(np.sum(log.stalled) * control_dt),
    }
    if reference is not None:
        out["tracking_rms"] = float(np.sqrt(np.mean((c - reference(times[first:])) ** 2)))
    return out


def _runtime(mode: str, robot, runner, latency, control_hz: float, chunk_size: int, priority: int = 0):
    fuser_name = "naive" if mode == "sync" else mode
    cfg = RuntimeConfig(control_hz=control_hz, schedule="sync" if mode == "sync" else "async")
    cfg.realtime_priority = priority
    cfg.spin_s = SPIN_S
    cfg.status_every_s = 0.0
    fuser = make_fuser(FuserConfig(name=fuser_name), SPEC, 1.0 / control_hz)
    inference = (
        SimulatedLatencyInference(runner, latency) if latency is not None else ThreadedInference(runner)
    )
    runtime = ControlRuntime(
        RobotIO(robot, SPEC.joint_names),
        inference,
        fuser,
        SafetyLimiter(SPEC, 1.0 / control_hz),
        SPEC,
        cfg,
        policy_chunk_size=chunk_size,
        use_prefix=fuser.wants_prefix,
    )
    return runtime


def latency_sampler(seed: int, median_s: float, jitter: float):
    rng = np.random.default_rng(seed)
    return lambda: median_s * float(np.exp(jitter * rng.standard_normal()))


def _mean_rows(rows: list[dict]) -> dict:
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}


# ---- parts ------------------------------------------------------------------------------------------
def open_loop(args) -> list[dict]:
    rows = []
    for latency_ms in args.latencies_ms:
        for mode in tqdm(MODES, desc=f"open loop {latency_ms} ms", leave=False):
            runs = []
            for seed in range(args.seeds):
                policy = SyntheticChunkPolicy(seed, args.chunk_size, inpaint=mode == "rtc")
                latency = latency_sampler(1000 + seed, latency_ms / 1e3, args.jitter)
                runtime = _runtime(mode, IdealArm(), policy, latency, args.control_hz, args.chunk_size)
                log = run_lockstep(runtime, args.open_loop_s)
                m = motion_metrics(log, 1.0 / args.control_hz, policy.reference)
                m["limited_frac"] = runtime.safety.limited_ticks / len(log.times)
                runs.append(m)
            rows.append({"latency_ms": latency_ms, "mode": mode, **_mean_rows(runs)})
    return rows


def closed_loop(args) -> list[dict]:
    from worldloop.sim.robot import SimRobot, SimRobotConfig

    vla = None
    if args.policy_path:
        from worldloop.real_robot.helpers import load_policy

        vla = load_policy(args.policy_path)
    rows = []
    for latency_ms in args.latencies_ms:
        for mode in tqdm(MODES, desc=f"closed loop {latency_ms} ms", leave=False):
            results, metrics = [], []
            for ep in range(args.episodes):
                cameras = ("front", "wrist") if vla is not None else ()  # the expert reads the scene state
                robot = SimRobot(
                    SimRobotConfig(task=args.task, seed=ep, control_hz=int(args.control_hz), cameras=cameras)
                )
                robot.connect()
                try:
                    if vla is not None:
                        vla.reset()
                        torch.manual_seed(ep)
                        policy = PolicyRunner(vla, SPEC.joint_names, robot.task, use_prefix=mode == "rtc")
                        chunk_size = vla.chunk_size
                    else:
                        policy = ExpertChunkPolicy(
                            robot, args.chunk_size, mode == "rtc", 5 if mode == "sync" else None
                        )
                        policy.reset(seed=ep)
                        chunk_size = args.chunk_size
                    latency = latency_sampler(2000 + ep, latency_ms / 1e3, args.jitter)
                    runtime = _runtime(mode, robot, policy, latency, args.control_hz, chunk_size)
                    log = run_lockstep(runtime, args.episode_s, stop=robot.task_success)
                    success = robot.task_success()
                    results.append((success, len(log.times) / args.control_hz))
                    metrics.append(motion_metrics(log, 1.0 / args.control_hz))
                finally:
                    if vla is None:
                        policy.close()
                    robot.disconnect()
            successes = [s for s, _ in results]
            times = [t for s, t in results if s]
            rows.append(
                {
                    "latency_ms": latency_ms,
                    "mode": mode,
                    "success_rate": float(np.mean(successes)),
                    "mean_time_to_success_s": float(np.mean(times)) if times else float("nan"),
                    **_mean_rows(metrics),
                }
            )
    return rows


class BusyChunkModel:
    """A policy-shaped CPU load: `compute_s` of matrix products per chunk, then a smooth chunk."""

    def __init__(self, compute_s: float, chunk_size: int):
        self.compute_s, self.chunk_size = compute_s, chunk_size
        self.x = torch.randn(256, 256)
        self.calls = 0

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        end = time.perf_counter() + self.compute_s
        while time.perf_counter() < end:
            self.x = torch.tanh(self.x @ self.x / 16)
        # a slow sweep around the middle of the joint ranges, continuing from call to call
        self.calls += 1
        t = 0.5 * self.calls + torch.arange(1, self.chunk_size + 1, dtype=torch.float64) / SPEC.fps
        mid = torch.as_tensor(0.5 * (SPEC.lower() + SPEC.upper()))
        return (mid + 0.3 * torch.sin(t)[:, None]).unsqueeze(0)


def serve_busy_model(compute_s: float, chunk_size: int, ports) -> None:
    """Child process: a localhost policy server around `BusyChunkModel` (inference without our GIL)."""
    from worldloop.real_robot.policy_server import PolicyServer

    torch.set_num_threads(1)
    server = PolicyServer(BusyChunkModel(compute_s, chunk_size), SPEC.joint_names, "127.0.0.1", 0)
    ports.put(server.address[1])
    server.serve_forever()


def jitter(args) -> list[dict]:
    import multiprocessing

    from worldloop.real_robot.policy_server import RemotePolicyClient

    rows = []
    setups = [("ideal arm", None)]
    if "closed" in args.parts or args.jitter_sim:
        setups.append(("sim robot (64x64 render at 10 Hz)", "sim"))
    variants = (("naive", 0, "thread"), ("rail", 0, "thread"), ("rail", args.priority, "thread"))
    variants += (("rail", args.priority, "process"),)
    for label, robot_kind in setups:
        for mode, priority, where in variants:
            if robot_kind == "sim":
                from worldloop.sim.robot import SimRobot, SimRobotConfig

                robot = SimRobot(SimRobotConfig(task=args.task, control_hz=int(args.control_hz)))
                robot.connect()
            else:
                robot = IdealArm(cameras=("front", "wrist"))
            server = None
            if where == "process":
                ctx = multiprocessing.get_context("spawn")
                ports = ctx.Queue()
                server = ctx.Process(
                    target=serve_busy_model, args=(args.jitter_compute_s, args.chunk_size, ports), daemon=True
                )
                server.start()
                runner = RemotePolicyClient(f"127.0.0.1:{ports.get(timeout=300)}", "jitter")
            else:
                runner = PolicyRunner(
                    BusyChunkModel(args.jitter_compute_s, args.chunk_size), SPEC.joint_names, "jitter", False
                )
            runtime = _runtime(mode, robot, runner, None, args.control_hz, args.chunk_size, priority)
            load_before = os.getloadavg()[0]
            log = run_realtime(runtime, args.jitter_s, status=None)
            runtime.inference.close()
            if server is not None:
                runner.close()
                server.terminate()
                server.join()
            if robot_kind == "sim":
                robot.disconnect()
            err = np.abs(np.array(log.periods) - 1.0 / args.control_hz) * 1e3
            rows.append(
                {
                    "robot": label,
                    "fuser": mode,
                    "sched": f"FIFO {priority}" if priority else "normal",
                    "inference": where,
                    "ticks": len(log.periods),
                    "period_jitter_p50_ms": float(np.percentile(err, 50)),
                    "period_jitter_p99_ms": float(np.percentile(err, 99)),
                    "period_jitter_max_ms": float(err.max()),
                    "overruns": log.overruns,
                    "inference_delay_p50_ms": float(np.median(log.delays) * 1e3)
                    if log.delays
                    else float("nan"),
                    "loadavg_1min_before": load_before,
                    "loadavg_1min_after": os.getloadavg()[0],
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", default="open,closed,jitter")
    p.add_argument("--latencies_ms", type=int, nargs="+", default=[50, 150, 300])
    p.add_argument("--jitter", type=float, default=0.25, help="log-normal sigma of the latency")
    p.add_argument("--control_hz", type=float, default=100.0)
    p.add_argument("--chunk_size", type=int, default=10)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--open_loop_s", type=float, default=30.0)
    p.add_argument("--task", default="push")
    p.add_argument("--policy_path", default=None, help="closed loop with this policy instead of the expert")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--episode_s", type=float, default=8.0)
    p.add_argument("--jitter_s", type=float, default=20.0)
    p.add_argument("--jitter_compute_s", type=float, default=0.15)
    p.add_argument("--jitter_sim", action="store_true", help="also measure jitter with the sim robot")
    p.add_argument("--priority", type=int, default=50, help="SCHED_FIFO priority of the control thread")
    p.add_argument("--result_name", default="chunk_fusion", help="benchmarks/results/<name>.json")
    p.add_argument("--spin_s", type=float, default=RuntimeConfig.spin_s, help="busy-wait before each tick")
    args = p.parse_args()
    global SPIN_S
    SPIN_S = args.spin_s
    args.parts = args.parts.split(",")
    torch.set_num_threads(1)

    figures: dict = {"settings": {k: v for k, v in vars(args).items()}}
    if "open" in args.parts:
        figures["open_loop"] = rows = open_loop(args)
        print_table(rows, "open loop (synthetic chunks, lock-step latency)")
    if "closed" in args.parts:
        figures["closed_loop"] = rows = closed_loop(args)
        figures["closed_loop_policy"] = (
            f"policy {args.policy_path} (sync and async with the same latencies)"
            if args.policy_path
            else "scripted expert (skill 1) wrapped as a chunking policy with artificial latency"
        )
        print_table(rows, f"closed loop (sim {args.task}, scripted-expert chunks, lock-step latency)")
    if "jitter" in args.parts:
        figures["jitter"] = rows = jitter(args)
        print_table(rows, f"control-period jitter at {args.control_hz:.0f} Hz (wall clock)")
    print(write_result(args.result_name, figures))


if __name__ == "__main__":
    main()
