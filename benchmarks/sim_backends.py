"""MuJoCo vs Genesis for the tabletop suite: scene build time, step+render speed, expert (and policy) parity.

    MUJOCO_GL=egl OMP_NUM_THREADS=1 python benchmarks/sim_backends.py [--episodes 50 --steps 100]
        [--policy outputs/bench/policy_bc/180ep/pretrained_model --policy_task reach]

Per backend, in one process: `build_first_s` is the first env construction in the process (for Genesis it
compiles kernels, reusing the on-disk kernel cache of earlier runs when there is one), `first_step_s` the
first step+render after it (Genesis compiles more lazily), `build_again_s` a second construction in the same
process. Speed is env steps with both 64x64 cameras rendered (one env step = 0.1 s of physics, 20 physics
steps), best of `--repeats`; `physics_steps_per_s` is the same without cameras. Parity is the scripted expert
(skill 1) on the same seeds on both backends, and optionally one saved policy evaluated on both.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from benchmarks.expert_success import evaluate as evaluate_expert  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.sim.backends import SIM_BACKENDS  # noqa: E402
from worldloop.sim.tabletop_env import TabletopEnv  # noqa: E402

CAMERAS = ("front", "wrist")
PARITY_POINTS = 10.0  # issue 9: expert success within 10 points across backends


def smooth_actions(env: TabletopEnv, steps: int, seed: int) -> np.ndarray:
    """A slow random walk of joint targets inside the limits, so the arm keeps moving."""
    rng = np.random.default_rng(seed)
    q, out = env.sim.home.copy(), []
    for _ in range(steps):
        q = np.clip(q + rng.normal(0, 0.08, q.shape), env.embodiment.lower(), env.embodiment.upper())
        out.append(q.copy())
    return np.stack(out)


def timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def best_rollout_seconds(env: TabletopEnv, actions: np.ndarray, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        env.reset(seed=0)
        seconds, _ = timed(lambda: [env.step(a) for a in actions])
        times.append(seconds)
    return min(times)


def speed(backend: str, image_size: int, steps: int, repeats: int) -> dict:
    def make(cameras):
        return TabletopEnv(
            task="push", image_size=image_size, cameras=cameras, max_steps=10**6, backend=backend
        )

    build_first, env = timed(lambda: make(CAMERAS))
    env.reset(seed=0)
    first_step, _ = timed(lambda: env.step(env.sim.home.astype(np.float32)))
    build_again, again = timed(lambda: make(CAMERAS))
    again.close()
    actions = smooth_actions(env, steps, seed=0)
    step_render = best_rollout_seconds(env, actions, repeats)
    env.close()
    physics_env = make(())
    physics = best_rollout_seconds(physics_env, actions, repeats)
    physics_env.close()
    return {
        "backend": backend,
        "build_first_s": build_first,
        "first_step_s": first_step,
        "build_again_s": build_again,
        "step_render_per_s": steps / step_render,
        "frames_per_s": steps * len(CAMERAS) / step_render,
        "physics_steps_per_s": steps / physics,
    }


def policy_success(backend: str, policy, task: str, episodes: int, seed: int, batch_envs: int) -> dict:
    from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim

    cfg = SimEvalConfig(task=task, batch_envs=batch_envs, videos=0, backend=backend)
    summary = evaluate_in_sim(policy, cfg, episodes, seed, video_dir=None, progress_bar=True)
    return {
        "success_rate": summary["success_rate"],
        "success_ci95": summary["success_ci95"],
        "mean_progress": summary["mean_progress"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backends", nargs="+", default=list(SIM_BACKENDS), choices=SIM_BACKENDS)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100, help="env steps per speed rollout")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=50, help="expert episodes per task and backend")
    parser.add_argument("--seed", type=int, default=10_000)  # as benchmarks/expert_success.py
    parser.add_argument("--tasks", nargs="+", default=["reach", "push"])
    parser.add_argument("--policy", default="", help="a pretrained policy directory to evaluate on both")
    parser.add_argument("--policy_task", default="reach")
    parser.add_argument("--policy_episodes", type=int, default=50)
    parser.add_argument("--policy_seed", type=int, default=100_000)  # as evaluate_policy.py
    parser.add_argument("--batch_envs", type=int, default=5)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]

    speed_rows = [speed(b, args.image_size, args.steps, args.repeats) for b in args.backends]
    print_table(
        speed_rows,
        title=f"build and speed ({args.image_size}x{args.image_size}, cameras {', '.join(CAMERAS)}, "
        f"{args.steps} env steps, best of {args.repeats})",
    )

    parity_rows = []
    for task in args.tasks:
        row = {"who": "expert", "task": task, "episodes": args.episodes}
        for b in args.backends:
            row[f"{b}_success"] = evaluate_expert(task, 1.0, args.episodes, args.seed, backend=b)[
                "success_rate"
            ]
        parity_rows.append(row)
    if args.policy:
        row = {"who": "policy", "task": args.policy_task}
        row["episodes"] = args.policy_episodes
        from worldloop.vla.factory import load_policy

        policy = load_policy(args.policy, "cpu")  # loaded once: both backends see the same weights
        for b in args.backends:
            result = policy_success(
                b, policy, args.policy_task, args.policy_episodes, args.policy_seed, args.batch_envs
            )
            row[f"{b}_success"] = result["success_rate"]
            row[f"{b}_ci95"] = result["success_ci95"]
        parity_rows.append(row)
    if set(SIM_BACKENDS) <= set(args.backends):
        for row in parity_rows:
            row["gap_points"] = 100 * (row["genesis_success"] - row["mujoco_success"])
            if row["who"] == "expert":
                row["within_10_points"] = abs(row["gap_points"]) <= PARITY_POINTS
    print_table(parity_rows, title="success parity (same seeds on each backend)")

    load = {"load_avg_1min_before": load_before, "load_avg_1min_after": os.getloadavg()[0]}
    print(f"machine load (1-min average) before/after: {load_before:.1f} / {load['load_avg_1min_after']:.1f}")
    path = write_result(
        "sim_backends",
        {
            "image_size": args.image_size,
            "steps": args.steps,
            "repeats": args.repeats,
            "seed": args.seed,
            "policy": args.policy or None,
            **load,
            "speed": speed_rows,
            "parity": parity_rows,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
