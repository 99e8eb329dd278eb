"""Fault injection on the deploy runtime: how many fault cases were tried, how many kept the arm within
its limits (and ended held), how many frames a crash of a recording run lost.

    python benchmarks/runtime_faults.py [--limit_cases 2000 --server_messages 1000 --blocked_runs 20 \\
        --signal_runs 4 --kills 6]

- limits: random starts (each joint outside its limits with probability 1/4, by up to 1.5x the start
  margin) and
  random target streams (jumps, out of range, NaN/inf, wrong shapes, holds), through `SafetyLimiter`;
  kept = `limit_violations` finds nothing and every joint ends inside, at rest. Starts beyond the margin
  must be refused.
- server: random and malformed messages (`fault_injection.malformed_message`), one client each; kept
  = the server answers a good client after every 100.
- blocked joint: lock-step runs towards a random goal in which a random joint stops following for a
  random time (`fault_injection.run_blocked`); kept = no joint moved more in one tick than the guard
  allows (margin + the error it may miss for tracking_ticks and one observation period at the velocity
  limit); the same runs without the guard for contrast.
- signals: deploy runs in a child process (`python -m worldloop.real_robot.fault_injection`) sent SIGINT
  or SIGTERM, then another during the stop; kept = no limit violated, held still for the whole hold, then
  disconnected.
- kill -9: recording deploy runs killed at a random time; the dataset is read back with lerobot (after
  `repair_recording` where the kill hit a save); lost = frames observed but not on disk.
The machine is shared: the load average is recorded with the figures.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.embodiment import TABLETOP_ARM  # noqa: E402
from worldloop.data.recording import RECORDING_META, repair_recording  # noqa: E402
from worldloop.real_robot.fault_injection import (  # noqa: E402
    answers_a_good_client,
    count_sends,
    malformed_message,
    read_sends,
    run_blocked,
    saved_segments,
    send_raw,
    start_child,
    start_policy_server,
    wait_for,
)
from worldloop.real_robot.safety import (  # noqa: E402
    SafetyConfig,
    SafetyLimiter,
    SafetyStop,
    limit_violations,
)

SPEC, DT = TABLETOP_ARM, 0.01
HOLD_S = 0.5


def limits(cases: int, rng: np.random.Generator) -> dict:
    lower, upper = SPEC.lower(), SPEC.upper()
    cfg_margin = SafetyConfig().start_margin
    kept = refused = beyond = 0
    for _ in range(cases):
        scale = float(rng.choice([1.0, 0.5]))
        start = lower + rng.uniform(0.0, 1.0, SPEC.num_joints) * (upper - lower)
        out = rng.random(SPEC.num_joints) < 0.25  # these joints start outside, up to 1.5x the margin
        side = np.where(rng.random(SPEC.num_joints) < 0.5, lower, upper)
        away = np.where(side == lower, -1.0, 1.0) * rng.uniform(0.0, 1.5 * cfg_margin, SPEC.num_joints)
        start = np.where(out, side + away, start)
        limiter = SafetyLimiter(SPEC, DT, SafetyConfig(limit_scale=scale))
        if np.max(np.maximum(lower - start, start - upper)) > cfg_margin:
            beyond += 1
            try:
                limiter.reset(start)
            except SafetyStop:
                refused += 1
            continue
        limiter.reset(start)
        stream, walk = [], start.copy()
        for _ in range(int(rng.integers(1, 200))):
            kind = rng.integers(6)
            if kind == 0:
                stream.append(None)  # brake to a hold
            elif kind == 1:
                stream.append(rng.uniform(-5, 5, SPEC.num_joints))  # anywhere, far out of range too
            elif kind == 2:
                stream.append(rng.choice([np.nan, np.inf, -np.inf, 0.0], SPEC.num_joints))
            elif kind == 3:
                stream.append(rng.uniform(-1, 1, int(rng.integers(0, 8))))  # wrong shapes
            else:  # ordinary policy output: a random walk
                walk = walk + rng.normal(0.0, 0.05, SPEC.num_joints)
                stream.append(walk.copy())
        vmax, amax = scale * SPEC.max_velocity(), scale * SPEC.max_acceleration()
        settle = int(np.max(np.abs(start - np.clip(start, lower, upper)) / vmax + 2 * vmax / amax) / DT) + 20
        commands = np.array([limiter.filter(target) for target in [*stream, *[None] * settle]])
        inside = np.all(commands[-1] >= lower) and np.all(commands[-1] <= upper) and limiter.at_rest()
        kept += int(not limit_violations(SPEC, DT, start, commands, scale) and inside)
    started = cases - beyond
    return {
        "cases": cases,
        "started": started,
        "kept_within_limits": kept,
        "beyond_margin": beyond,
        "refused": refused,
    }


def server(messages: int, rng: np.random.Generator) -> dict:
    srv, _ = start_policy_server()
    answered = checks = 0
    kinds: dict[str, int] = {}
    try:
        for i in range(messages):
            kind, message, hello = malformed_message(rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            send_raw(srv, message, hello)
            if i % 100 == 99:
                checks += 1
                answered += int(answers_a_good_client(srv))
    finally:
        srv.close()
    return {
        "messages": messages,
        "kinds": len(kinds),
        "clients_dropped": srv.dropped,
        "good_client_checks": checks,
        "good_client_answered": answered,
    }


def blocked(runs: int, rng: np.random.Generator) -> dict:
    margin, ticks = 0.1, 20  # run_blocked's guard
    # Undetected, the error may exceed the margin for `ticks` ticks and one observation period (10 ticks)
    # more, growing at the velocity limit: the most a freed joint can then move in one tick.
    bound = margin + (ticks + 10) * SPEC.max_velocity() * DT
    kept = tripped = 0
    jumps, unguarded = [], []
    for _ in range(runs):
        joint = int(rng.integers(SPEC.num_joints))
        goal = np.zeros(SPEC.num_joints)
        far = SPEC.upper()[joint] if rng.random() < 0.5 else SPEC.lower()[joint]  # a goal it must move to
        goal[joint] = far * rng.uniform(0.6, 0.95)
        blocked_from = int(rng.integers(5, 40))
        freed_at = blocked_from + int(rng.integers(60, 200))
        robot, _, stop = run_blocked(margin, joint, blocked_from, freed_at, tuple(goal))
        steps = np.abs(np.diff(np.array(robot.measured), axis=0))
        tripped += int(stop is not None)
        kept += int(np.all(steps <= bound + 1e-9))
        jumps.append(float(steps.max()))
        free, _, _ = run_blocked(None, joint, blocked_from, freed_at, tuple(goal))
        unguarded.append(float(np.max(np.abs(np.diff(np.array(free.measured), axis=0)))))
    return {
        "runs": runs,
        "guard_tripped": tripped,
        "step_bound_rad": bound.tolist(),
        "kept_within_bound": kept,
        "max_step_with_guard_rad": max(jumps),
        "max_step_without_guard_rad": max(unguarded),
    }


def signals(runs: int, rng: np.random.Generator) -> dict:
    kept = 0
    cases = []
    for i in range(runs):
        first = [signal.SIGINT, signal.SIGTERM][i % 2]
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "sent.log"
            child = start_child(Path(tmp), f"--stop_hold_s={HOLD_S}")
            try:
                wait_for(lambda log=log: count_sends(log) >= 100, 180, "the child to run 1 s")
                time.sleep(rng.uniform(0.0, 1.0))
                child.send_signal(first)
                time.sleep(rng.uniform(0.0, 0.3))  # inside the stop
                child.send_signal(signal.SIGINT)
                _, stderr = child.communicate(timeout=60)
            finally:
                child.kill()
            lines = log.read_text().splitlines()
            sent = read_sends(log)
            hold = int(HOLD_S / DT)
            ok = (
                child.returncode == 130
                and lines[-1] == "disconnect"
                and not limit_violations(SPEC, DT, np.full(SPEC.num_joints, 0.2), sent)
                and np.abs(sent[-hold:] - sent[-1]).max() < 1e-12
            )
            kept += int(ok)
            cases.append(f"{signal.Signals(first).name}+SIGINT")
    return {"runs": runs, "cases": cases, "kept_within_limits_held_and_disconnected": kept}


def kills(runs: int, rng: np.random.Generator, segment_s: float) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from worldloop.data.features import STATE

    if runs == 0:
        return {"runs": 0}
    lost, readable, repaired, exact = [], 0, 0, 0
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "run"
            child = start_child(Path(tmp), "--record", f"--segment_s={segment_s}")
            try:
                wait_for(lambda root=root: saved_segments(root) >= 1, 180, "a saved segment")
                time.sleep(rng.uniform(0.0, 4.0))
            finally:
                child.kill()
                child.communicate(timeout=30)
            try:
                LeRobotDataset("local/deploy_runs", root=root)
                direct = True
            except Exception:
                direct = False
            readable += int(direct)
            repaired += int(bool(repair_recording(root)))
            recording = json.loads((root / RECORDING_META).read_text())
            ds = LeRobotDataset("local/deploy_runs", root=root)
            on_disk = sum(e["length"] for e in recording["episodes"])
            observed = np.loadtxt(Path(tmp) / "observed.log", ndmin=2)
            states = np.stack([ds[i][STATE].numpy() for i in range(ds.num_frames)])
            exact += int(ds.num_frames == on_disk and np.allclose(states, observed[:on_disk], atol=1e-6))
            lost.append(len(observed) - 1 - on_disk)  # the last observation still waited for its action
    fps = SPEC.fps
    return {
        "runs": runs,
        "segment_s": segment_s,
        "readable_without_repair": readable,
        "repaired": repaired,
        "every_saved_frame_read_back": exact,
        "frames_lost": lost,
        "frames_lost_mean": float(np.mean(lost)),
        "frames_lost_max": int(np.max(lost)),
        "seconds_lost_max": float(np.max(lost)) / fps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--limit_cases", type=int, default=2000)
    parser.add_argument("--server_messages", type=int, default=1000)
    parser.add_argument("--blocked_runs", type=int, default=20)
    parser.add_argument("--signal_runs", type=int, default=4)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--segment_s", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    logging.basicConfig(level=logging.CRITICAL)  # thousands of expected rejections and drops: counted below
    load_before = os.getloadavg()[0]
    figures = {}
    for name, run in [
        ("limits", lambda: limits(args.limit_cases, rng)),
        ("server", lambda: server(args.server_messages, rng)),
        ("blocked_joint", lambda: blocked(args.blocked_runs, rng)),
        ("signals", lambda: signals(args.signal_runs, rng)),
        ("kill_9_recording", lambda: kills(args.kills, rng, args.segment_s)),
    ]:
        t = time.perf_counter()
        figures[name] = run()
        figures[name]["seconds"] = time.perf_counter() - t
        print(name, json.dumps(figures[name]), flush=True)
    figures["load_avg_1min_before"], figures["load_avg_1min_after"] = load_before, os.getloadavg()[0]
    path = write_result("runtime_faults", figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
