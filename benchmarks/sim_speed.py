"""Simulator speed: physics-only steps/s, render-only frames/s, and env step+render frames/s.

    MUJOCO_GL=egl OMP_NUM_THREADS=1 python benchmarks/sim_speed.py [--steps 200 --repeats 10]

One env step = 1/fps s of physics (20 MuJoCo steps) + rendering both cameras (`front`, `wrist`). The
machine is shared, so each figure is the best of `--repeats` runs and the load average is recorded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.sim.tabletop_env import TabletopEnv  # noqa: E402

CAMERAS = ("front", "wrist")


def smooth_actions(env: TabletopEnv, steps: int, seed: int) -> np.ndarray:
    """A slow random walk of joint targets inside the limits (the arm keeps moving, the scene changes)."""
    rng = np.random.default_rng(seed)
    lo, hi = env.embodiment.lower(), env.embodiment.upper()
    q = env.sim.home.copy()
    out = []
    for _ in range(steps):
        q = np.clip(q + rng.normal(0, 0.08, q.shape), lo, hi)
        out.append(q.copy())
    return np.stack(out)


def best_seconds(run: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times)


def rollout(env: TabletopEnv, actions: np.ndarray) -> Callable[[], None]:
    def run() -> None:
        env.reset(seed=0)
        for a in actions:
            env.step(a)

    return run


def measure(image_size: int, steps: int, repeats: int) -> dict:
    env = TabletopEnv(task="push", image_size=image_size, cameras=CAMERAS, max_steps=10**6)
    env.reset(seed=0)
    actions = smooth_actions(env, steps, seed=0)
    step_render = best_seconds(rollout(env, actions), repeats)

    def render_only() -> None:
        for _ in range(steps):
            env.sim.render()

    render = best_seconds(render_only, repeats)
    env.close()
    physics_env = TabletopEnv(task="push", cameras=(), max_steps=10**6)
    physics = best_seconds(rollout(physics_env, actions), repeats)
    physics_env.close()
    n_cam = len(CAMERAS)
    return {
        "image_size": f"{image_size}x{image_size}",
        "env_steps_per_s": steps / step_render,
        "env_frames_per_s": steps * n_cam / step_render,
        "render_frames_per_s": steps * n_cam / render,
        "physics_env_steps_per_s": steps / physics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = [measure(size, args.steps, args.repeats) for size in args.sizes]
    title = (
        f"tabletop sim speed ({args.steps} env steps, best of {args.repeats}, cameras {', '.join(CAMERAS)})"
    )
    print_table(rows, title=title)
    load = {"load_avg_1min_before": load_before, "load_avg_1min_after": os.getloadavg()[0]}
    print(f"machine load (1-min average) before/after: {load_before:.1f} / {load['load_avg_1min_after']:.1f}")
    path = write_result("sim_speed", {"steps": args.steps, "repeats": args.repeats, **load, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
