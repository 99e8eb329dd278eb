"""Simulator speed: physics-only steps/s, render-only frames/s, and env step+render frames/s.

    MUJOCO_GL=egl OMP_NUM_THREADS=1 python benchmarks/sim_speed.py [--steps 400]

One env step = 1/fps s of physics (20 MuJoCo steps) + rendering both cameras (`front`, `wrist`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import print_table, write_result  # noqa: E402
from sim.tabletop_env import TabletopEnv  # noqa: E402

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


def measure(image_size: int, steps: int) -> dict:
    env = TabletopEnv(task="push", image_size=image_size, cameras=CAMERAS, max_steps=10**6)
    env.reset(seed=0)
    actions = smooth_actions(env, steps, seed=0)
    t = time.perf_counter()
    for a in actions:
        env.step(a)
    step_render = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(steps):
        env.sim.render()
    render = time.perf_counter() - t
    env.close()

    physics_env = TabletopEnv(task="push", cameras=(), max_steps=10**6)
    physics_env.reset(seed=0)
    t = time.perf_counter()
    for a in actions:
        physics_env.step(a)
    physics = time.perf_counter() - t
    physics_env.close()
    n_cam = len(CAMERAS)
    return {
        "image_size": f"{image_size}x{image_size}",
        "env_steps_per_s": steps / step_render,
        "env_frames_per_s": steps * n_cam / step_render,
        "render_frames_per_s": steps * n_cam / render,
        "physics_steps_per_s": steps / physics,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    args = parser.parse_args()
    rows = [measure(size, args.steps) for size in args.sizes]
    print_table(rows, title=f"tabletop sim speed ({args.steps} env steps, cameras {', '.join(CAMERAS)})")
    path = write_result("sim_speed", {"steps": args.steps, "cameras": list(CAMERAS), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
