"""The control runtime: one tick of fusion, safety and command at a fixed rate, inference beside it.

`ControlRuntime.step(now)` is everything that happens on one control tick; it never waits on inference.
`run_realtime` calls it at a fixed wall-clock rate (sleep, then a short spin for precision) and measures
the period of every tick; `run_lockstep` calls it on a virtual clock (lock-step simulation, benchmarks).
Every chunk is stamped with the control-clock time of its observation; the fuser samples it at the
current time, so the actions that became past while it was computed are skipped (delay alignment).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from worldloop.common.embodiment import EmbodimentSpec
from worldloop.real_robot.fusion import Chunk, ChunkFuser
from worldloop.real_robot.helpers import check_number
from worldloop.real_robot.inference import InferenceRequest
from worldloop.real_robot.safety import SafetyLimiter, SafetyStop, TrackingGuard
from worldloop.real_robot.watchdog import Watchdog

logger = logging.getLogger(__name__)


@dataclass
class RuntimeConfig:
    control_hz: float = 100.0  # command rate sent to the robot
    request_threshold: float = 0.5  # ask for the next chunk when this fraction of the last chunk is left
    delay_margin: float = 2.0  # ...or earlier: when only this many times the slowest recent delay is left
    schedule: str = "async"  # async | sync (baseline: the arm holds still while the policy computes)
    sync_action_steps: int = 5  # sync: actions executed from each chunk before asking again
    watchdog_timeout_s: float = 1.0  # brake to a hold when no fresh chunk arrived for this long
    spin_s: float = 0.002  # busy-wait this last part of each period (sleep alone wakes up late)
    realtime_priority: int = (
        0  # > 0: run the control thread SCHED_FIFO at this priority (Linux, needs rights)
    )
    status_every_s: float = 0.5  # live status line period (0: off)
    # The stop (end of episode, Ctrl-C, SIGTERM, an error): brake to a hold, then move at
    # `rest_speed_scale` of the velocity limit to `rest_pose` (joint units; null: stay where braked), then
    # keep holding with torque on for `stop_hold_s` before the robot is disconnected.
    stop_hold_s: float = 0.5
    rest_pose: list[float] | None = None
    rest_speed_scale: float = 0.2

    def __post_init__(self) -> None:
        check_number("runtime.control_hz", self.control_hz, low=0.0, high=10_000.0, low_open=True)
        if self.schedule not in ("async", "sync"):
            raise ValueError(f"runtime.schedule must be 'async' or 'sync', got {self.schedule!r}")
        check_number("runtime.request_threshold", self.request_threshold, low=0.0, high=1.0, low_open=True)
        check_number("runtime.delay_margin", self.delay_margin, low=0.0)
        check_number("runtime.sync_action_steps", self.sync_action_steps, low=1, integer=True)
        check_number("runtime.watchdog_timeout_s", self.watchdog_timeout_s, low=0.0, low_open=True)
        check_number("runtime.spin_s", self.spin_s, low=0.0, high=1.0 / self.control_hz)
        check_number("runtime.realtime_priority", self.realtime_priority, low=0, high=99, integer=True)
        check_number("runtime.status_every_s", self.status_every_s, low=0.0)
        check_number("runtime.stop_hold_s", self.stop_hold_s, low=0.0, high=3600.0)
        check_number("runtime.rest_speed_scale", self.rest_speed_scale, low=0.0, high=1.0, low_open=True)
        for i, value in enumerate(self.rest_pose or ()):
            check_number(f"runtime.rest_pose[{i}]", value)


class RobotIO:
    """Joint vectors in the embodiment's order <-> a LeRobot robot's `"<joint>.pos"` dicts."""

    def __init__(self, robot, joint_names: tuple[str, ...]):
        self.robot = robot
        self.joint_names = joint_names
        self.keys = [f"{j}.pos" for j in joint_names]

    def observe(self) -> tuple[np.ndarray, dict]:
        obs = self.robot.get_observation()
        missing = [k for k in self.keys if k not in obs]
        if missing:
            raise KeyError(f"{type(self.robot).__name__} observation lacks {missing}; has {sorted(obs)}")
        return np.array([float(obs[k]) for k in self.keys]), obs

    def send(self, position: np.ndarray) -> None:
        self.robot.send_action({k: float(v) for k, v in zip(self.keys, position)})


@dataclass
class RunLog:
    """What the runtime did, tick by tick (for the status line, the benchmark and tests)."""

    times: list[float] = field(default_factory=list)
    targets: list[np.ndarray] = field(default_factory=list)  # fuser output (before safety)
    commands: list[np.ndarray] = field(default_factory=list)  # sent to the robot
    stalled: list[bool] = field(default_factory=list)
    switch_times: list[float] = field(default_factory=list)  # chunk arrivals
    delays: list[float] = field(default_factory=list)  # obs -> arrival (control clock), cold start excluded
    compute_s: list[float] = field(default_factory=list)
    periods: list[float] = field(default_factory=list)  # measured wall-clock tick periods (real time only)
    overruns: int = 0
    stop_reason: str | None = None  # why the run was stopped early for safety (tracking guard)


class ControlRuntime:
    def __init__(
        self,
        io: RobotIO,
        inference,
        fuser: ChunkFuser,
        safety: SafetyLimiter,
        spec: EmbodimentSpec,
        cfg: RuntimeConfig,
        policy_chunk_size: int,
        use_prefix: bool = False,
        on_observation: Callable[[dict, float, np.ndarray], None] | None = None,
        tracking: TrackingGuard | None = None,
    ):
        self.io = io
        self.inference = inference
        self.fuser = fuser
        self.safety = safety
        self.spec = spec
        self.cfg = cfg
        self.control_dt = 1.0 / cfg.control_hz
        self.policy_dt = 1.0 / spec.fps
        self.chunk_size = policy_chunk_size
        self.use_prefix = use_prefix
        self.on_observation = on_observation  # recording: (observation, time, last command)
        self.tracking = tracking
        self.rest_pose = None if cfg.rest_pose is None else np.asarray(cfg.rest_pose, dtype=np.float64)
        if self.rest_pose is not None:
            lower, upper = spec.lower(), spec.upper()
            if self.rest_pose.shape != (spec.num_joints,) or np.any(
                (self.rest_pose < lower) | (self.rest_pose > upper)
            ):
                raise ValueError(
                    f"runtime.rest_pose must be {spec.num_joints} positions ({', '.join(spec.joint_names)}) "
                    f"within the joint limits {lower.tolist()}..{upper.tolist()}, got {cfg.rest_pose}"
                )
        self.watchdog = Watchdog(cfg.watchdog_timeout_s)
        interval = (1 - cfg.request_threshold) * policy_chunk_size * self.policy_dt
        if cfg.schedule == "async" and cfg.watchdog_timeout_s <= interval:
            logger.warning(
                "runtime.watchdog_timeout_s=%.2fs is shorter than the normal time between chunks (%.2fs): "
                "the watchdog will brake in normal operation",
                cfg.watchdog_timeout_s,
                interval,
            )
        self.log = RunLog()
        self._chunks_received = 0
        self._sync_resume = 0.0  # sync: when the current chunk's executed part ends
        self._waiting_sync = False
        self._next_obs_time = 0.0
        self._tick = 0

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self, now: float = 0.0) -> None:
        position, obs = self.io.observe()
        start = self.safety.reset(position)
        self.fuser.reset(start)
        self.watchdog.start(now)
        self._next_obs_time = now
        self._request(obs, now)

    def warm_up(self, runner) -> None:
        """One untimed inference before the clock starts, so cold start never counts as delay."""
        _, obs = self.io.observe()
        runner(InferenceRequest(obs, 0.0))

    def brake_ticks(self) -> int:
        """Ticks that bring the arm from its current speed to rest at full deceleration (plus margin)."""
        v = np.abs(self.safety.state.velocity)
        return int(np.max(np.ceil(v / (self.safety.amax * self.control_dt)))) + 2

    def stop_ticks(self) -> Iterator[None]:
        """The stop (end of episode, Ctrl-C, errors), one command sent per step: brake to a hold, move
        slowly to the rest pose if one is set, then hold for `stop_hold_s`. The caller paces the steps;
        a command that cannot be computed or sent ends it (logged)."""
        if not self.safety.started:
            return
        for _ in range(self.brake_ticks()):
            if not self._send_stop(None):
                return
            yield
        if self.rest_pose is not None:
            scale = self.cfg.rest_speed_scale
            far = np.abs(self.rest_pose - self.safety.state.position)
            vmax, amax = self.safety.vmax * scale, self.safety.amax
            ticks = int(np.max(far / vmax + 2 * vmax / amax) / self.control_dt) + 10
            for _ in range(ticks):
                if self.safety.at_rest(self.rest_pose):
                    break
                if not self._send_stop(self.rest_pose, scale):
                    return
                yield
        for _ in range(int(round(self.cfg.stop_hold_s * self.cfg.control_hz))):
            if not self._send_stop(None):
                return
            yield

    def _send_stop(self, target, speed_scale: float = 1.0) -> bool:
        try:
            self.io.send(self.safety.filter(target, speed_scale))
        except Exception as e:  # the original error (if any) is what the caller must see
            logger.error("safe stop: could not send the stopping command: %s", e)
            return False
        return True

    # ---- one control tick ----------------------------------------------------------------------------
    def step(self, now: float) -> np.ndarray:
        result = self.inference.poll(now)
        if result is not None:
            self._accept(result, now)

        observation = None
        if now + 1e-9 >= self._next_obs_time:  # at the policy rate: tracking guard and recording
            measured, observation = self.io.observe()
            self._check_tracking(measured)
            if self.on_observation is not None:
                self.on_observation(observation, now, self.safety.state.position)
            self._next_obs_time += self.policy_dt
        if not self.inference.busy and self._wants_chunk(now):
            if observation is None:
                _, observation = self.io.observe()
            self._request(observation, now)

        # A stall: the arm has nothing left to execute (waiting for the very first chunk is start-up).
        stalled = self._chunks_received > 0 and (self.fuser.remaining(now) <= 0 or self._waiting_sync)
        if self.watchdog.expired(now) or self._waiting_sync:
            target = None  # brake to a hold
        else:
            target = self.fuser.command(now)
        command = self.safety.filter(target)
        self.io.send(command)

        log = self.log
        log.times.append(now)
        log.targets.append(command if target is None else np.asarray(target, dtype=np.float64))
        log.commands.append(command)
        log.stalled.append(bool(stalled))
        self._tick += 1
        return command

    def _check_tracking(self, measured: np.ndarray) -> None:
        """Compare the measured position with the last command sent; stop if the guard trips."""
        if self.tracking is None:
            return
        reason = self.tracking.update(self._tick, measured, self.safety.state.position)
        if reason is None:
            return
        logger.error("safety stop: %s", reason)
        self.log.stop_reason = reason
        # Hold where the arm is, not where it was told to be: a blocked joint, once freed, must not jump
        # to a command that ran away from it.
        self.safety.reset(measured, check_margin=False)
        raise SafetyStop(reason)

    def _wants_chunk(self, now: float) -> bool:
        if self.cfg.schedule == "sync":
            if not self._waiting_sync and now + 1e-9 >= self._sync_resume:
                self._waiting_sync = True
                return True
            return False
        left = self.fuser.remaining(now)
        # A slow policy must be asked early enough that its chunk lands before the plan runs out (a stall).
        recent = self.log.delays[-5:]
        lead = max(recent) * self.cfg.delay_margin if recent else 0.0
        return left <= max(self.cfg.request_threshold * self.chunk_size * self.policy_dt, lead)

    def _request(self, observation: dict, now: float) -> None:
        prefix, delay = None, 0
        if self.use_prefix and self._chunks_received > 0:
            n = int(np.clip(math.floor(self.fuser.remaining(now) / self.policy_dt), 0, self.chunk_size))
            if n > 0:
                prefix = self.fuser.planned_actions(now, self.policy_dt, n)
                delay = min(n, self.expected_delay_steps())
        self.inference.submit(InferenceRequest(observation, now, prefix, delay), now)

    def expected_delay_steps(self) -> int:
        """Policy steps a chunk is expected to take (the slowest of the last few), for prefix inpainting."""
        recent = self.log.delays[-5:]
        return int(math.ceil(max(recent) / self.policy_dt)) if recent else 1

    def _accept(self, result, now: float) -> None:
        obs_time = result.obs_time
        if self._chunks_received > 0:  # the first answer includes warm-up effects: not a delay sample
            self.log.delays.append(now - obs_time)
        self.log.compute_s.append(result.compute_s)
        if self.cfg.schedule == "sync":
            # The arm held still while the policy computed: the chunk still starts where it was computed.
            obs_time = now
            self._waiting_sync = False
            self._sync_resume = now + self.cfg.sync_action_steps * self.policy_dt
        self._chunks_received += 1
        self.fuser.add_chunk(Chunk(result.actions, obs_time, self.policy_dt), now, self.safety.state)
        self.watchdog.feed(now)
        self.log.switch_times.append(now)

    # ---- status --------------------------------------------------------------------------------------
    def status_line(self, now: float) -> str:
        periods = np.asarray(self.log.periods[-200:])
        rate = 1.0 / periods.mean() if len(periods) else float("nan")
        p99 = np.percentile(np.abs(periods - self.control_dt), 99) * 1e3 if len(periods) else float("nan")
        delay = self.log.delays[-1] * 1e3 if self.log.delays else float("nan")
        queued = max(0.0, self.fuser.remaining(now)) / self.policy_dt
        rejected = sum(self.safety.rejections.values())
        return (
            f"t={now:6.1f}s loop {rate:6.1f} Hz (jitter p99 {p99:5.2f} ms) | inference delay {delay:5.0f} ms"
            f" | queue {queued:4.1f} actions | chunks {self._chunks_received} | stalls {sum(self.log.stalled)}"
            f" | watchdog {self.watchdog.fired_count} | rejected {rejected}"
        )


def run_lockstep(
    runtime: ControlRuntime, duration_s: float, stop: Callable[[], bool] | None = None
) -> RunLog:
    """Ticks on a virtual clock: inference delay comes from the inference object, not from wall time."""
    n = int(round(duration_s * runtime.cfg.control_hz))
    try:
        runtime.start(0.0)
        for tick in range(n):
            runtime.step(tick * runtime.control_dt)
            if stop is not None and stop():
                break
    finally:
        with interrupts_deferred("the safe stop"):
            for _ in runtime.stop_ticks():
                pass
    return runtime.log


def run_realtime(
    runtime: ControlRuntime, duration_s: float, stop: Callable[[], bool] | None = None, status=sys.stderr
) -> RunLog:
    """Ticks at `control_hz` of wall-clock time; any exception, Ctrl-C or SIGTERM stops the arm first
    (`ControlRuntime.stop_ticks`). An interrupt takes effect between two ticks (the command stream never
    misses a tick); a second one before that escapes a hung robot call at once."""
    cfg = runtime.cfg
    period = runtime.control_dt
    # The inference thread would otherwise hold the GIL for up to 5 ms when the control tick is due.
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(min(old_switch, 2e-4))
    next_status = cfg.status_every_s
    old_policy = _enter_realtime_priority(cfg.realtime_priority)
    interrupted: list[str] = []
    try:
        runtime.start(0.0)
        deadline, last_start, tick = time.perf_counter(), None, 0
        with interrupts_between_ticks(interrupted):
            while tick * period < duration_s:
                start = time.perf_counter()
                if last_start is not None:
                    runtime.log.periods.append(start - last_start)
                last_start = start
                now = tick * period
                runtime.step(now)
                if interrupted:
                    raise KeyboardInterrupt(interrupted[0])
                if stop is not None and stop():
                    break
                if status is not None and cfg.status_every_s > 0 and now >= next_status:
                    status.write("\r" + runtime.status_line(now))
                    status.flush()
                    next_status += cfg.status_every_s
                tick += 1
                deadline = _wait_until(deadline + period, cfg.spin_s)
                if time.perf_counter() - deadline > period:  # fell a whole period behind: do not burst
                    runtime.log.overruns += 1
                    deadline = time.perf_counter()
            if interrupted:  # came during the last period
                raise KeyboardInterrupt(interrupted[0])
    finally:
        with interrupts_deferred("the safe stop"):
            deadline = time.perf_counter()
            for _ in runtime.stop_ticks():
                deadline = _wait_until(deadline + period, cfg.spin_s)
            sys.setswitchinterval(old_switch)
            if old_policy is not None:
                os.sched_setscheduler(0, *old_policy)
            if status is not None and cfg.status_every_s > 0:
                status.write("\n")
    return runtime.log


@contextmanager
def _signal_handlers(handler, signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Within: `handler` for `signals`, the previous handlers restored after. Signals reach Python's main
    thread only, so elsewhere this installs nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


@contextmanager
def interrupts_between_ticks(received: list[str]) -> Iterator[None]:
    """Within: a first Ctrl-C or SIGTERM is appended to `received` (the caller stops after the tick); a
    second raises KeyboardInterrupt at once."""

    def note(signum, frame):
        name = signal.Signals(signum).name
        if received:
            raise KeyboardInterrupt(name)
        received.append(name)

    with _signal_handlers(note, (signal.SIGINT, signal.SIGTERM)):
        yield


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Within: SIGTERM raises KeyboardInterrupt, as Ctrl-C does, so that `kill` stops the arm safely."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    with _signal_handlers(interrupt, (signal.SIGTERM,)):
        yield


@contextmanager
def interrupts_deferred(what: str) -> Iterator[None]:
    """Within: Ctrl-C and SIGTERM are logged and held back, so that a second interrupt cannot cut `what`
    short; one that came is raised (KeyboardInterrupt) once `what` is done, unless an error is already on
    its way. `kill -9` still ends the process."""
    received: list[str] = []

    def hold_back(signum, frame):
        name = signal.Signals(signum).name
        received.append(name)
        logger.warning("%s: %s must finish first (kill -9 forces an exit without it)", name, what)

    with _signal_handlers(hold_back, (signal.SIGINT, signal.SIGTERM)):
        yield
    if received and sys.exc_info()[0] is None:  # (inside a `finally`, exc_info is the error on its way)
        raise KeyboardInterrupt(received[0])


def _enter_realtime_priority(priority: int):
    """Make the calling (control) thread SCHED_FIFO; returns the policy to restore, or None."""
    if priority <= 0:
        return None
    if not hasattr(os, "sched_setscheduler"):
        logger.warning("runtime.realtime_priority: this OS has no SCHED_FIFO; running at normal priority")
        return None
    old = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except PermissionError:
        logger.warning(
            "runtime.realtime_priority=%d: not permitted (needs CAP_SYS_NICE or an rtprio limit); "
            "running at normal priority",
            priority,
        )
        return None
    return old


def _wait_until(deadline: float, spin_s: float) -> float:
    left = deadline - time.perf_counter()
    if left > spin_s:
        time.sleep(left - spin_s)
    while time.perf_counter() < deadline:
        pass
    return deadline
