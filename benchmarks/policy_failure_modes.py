"""How a policy fails at reach in the sim, and whether it fails the same way every time.

python benchmarks/policy_failure_modes.py --policy=outputs/zoo/60ep_step00600 --episodes=40 --repeats=6

1. `episodes` sim episodes (seeds seed..): each failure is sorted by where the fingertip got closest to:
   `wrong_cube` (within the success radius of another cube, never of the named one), `near_miss` (within
   twice the radius of the named cube) or `elsewhere`.
2. The first `repeat_starts` failing start states are run again `repeats` times with other sampler seeds
   (same sim seed, so the same cubes and arm): how often the policy's own randomness turns a failure into
   a success. RL that compares rollouts of one start (GRPO, NFT) learns only where this happens.
3. The first `follow_starts` start states are run once under each cube's instruction (the same scene and
   arm, `TabletopEnv.reset(options={"cube": ...})`): which cube the fingertip reached, by instruction. A
   policy that follows instructions fills the diagonal; one that goes where it always goes fills columns.

Prints both tables and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.sim.scene import CUBE_COLORS  # noqa: E402
from worldloop.sim.tasks import REACH_RADIUS  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.vla.sim_evaluation import SimEvalConfig  # noqa: E402
from worldloop.vla.sim_recording import KeepsLastObservation, PolicyActor  # noqa: E402


@dataclass
class FailureModesConfig:
    policy: str = "outputs/zoo/60ep_step00600"
    episodes: int = 40
    seed: int = 200_000
    repeats: int = 6  # sampler seeds per failing start state
    repeat_starts: int = 10  # failing start states run again
    follow_starts: int = 20  # start states run under every cube's instruction
    max_steps: int = 50
    threads: int = 1
    name: str = ""  # "" -> policy_failure_modes


def run_episode(
    env: KeepsLastObservation, actor: PolicyActor, seed: int, sampler_seed: int, cube: str | None = None
) -> dict:
    """One episode (naming `cube` instead of the seed's own); the closest the fingertip came to the named
    cube and to any other, and the cube it reached (None: none within the success radius)."""
    env.reset(seed=seed, options=None if cube is None else {"cube": cube})
    actor.reset(sampler_seed)
    sim_env = env.unwrapped
    target = sim_env.task.cube
    closest = {cube: np.inf for cube in sim_env.scene_state().cubes}
    success = False
    done = False
    while not done:
        _, _, terminated, truncated, info = env.step(actor.act())
        state = sim_env.scene_state()
        for cube, position in state.cubes.items():
            closest[cube] = min(closest[cube], float(np.linalg.norm(state.tip - position)))
        success |= bool(info["success"])
        done = terminated or truncated
    other = min(d for cube, d in closest.items() if cube != target)
    if success:
        mode = "success"
    elif other <= REACH_RADIUS:
        mode = "wrong_cube"
    elif closest[target] <= 2 * REACH_RADIUS:
        mode = "near_miss"
    else:
        mode = "elsewhere"
    nearest = min(closest, key=closest.get)
    return {"seed": seed, "sampler_seed": sampler_seed, "task": sim_env.task.instruction, "mode": mode,
            "closest_target_m": closest[target], "closest_other_m": other,
            "named": target, "reached": nearest if closest[nearest] <= REACH_RADIUS else None}  # fmt: skip


def main() -> None:
    from worldloop.sim.tabletop_env import TabletopEnv

    cfg = parse_cli(FailureModesConfig)
    torch.set_num_threads(cfg.threads)
    policy = load_policy(cfg.policy).eval()
    sim_cfg = SimEvalConfig(task="reach", max_steps=cfg.max_steps)
    env_cfg = sim_cfg.env_config(policy.config.image_size[0], tuple(policy.config.cameras))
    env = KeepsLastObservation(TabletopEnv(env_cfg))
    actor = PolicyActor(policy, env, "cpu")
    try:
        episodes = [run_episode(env, actor, s, s) for s in range(cfg.seed, cfg.seed + cfg.episodes)]
        failing = [e["seed"] for e in episodes if e["mode"] != "success"][: cfg.repeat_starts]
        repeats = [
            run_episode(env, actor, s, 1_000_000 + s * cfg.repeats + k)
            for s in failing
            for k in range(cfg.repeats)
        ]
        starts = range(cfg.seed, cfg.seed + min(cfg.follow_starts, cfg.episodes))
        following = [run_episode(env, actor, s, s, cube) for s in starts for cube in CUBE_COLORS]
    finally:
        env.close()
    modes = ("success", "wrong_cube", "near_miss", "elsewhere")
    counts = {m: sum(e["mode"] == m for e in episodes) for m in modes}
    turned = sum(e["mode"] == "success" for e in repeats)
    print_table([{"episodes": cfg.episodes, **counts}], title=f"{cfg.policy}: reach, sim seeds {cfg.seed}..")
    per_start = [
        {"seed": s, "successes": sum(e["mode"] == "success" for e in repeats if e["seed"] == s), "of": cfg.repeats,
         "modes": " ".join(sorted({e["mode"] for e in repeats if e["seed"] == s}))}
        for s in failing
    ]  # fmt: skip
    print_table(per_start, title=f"\nfailing start states run again with {cfg.repeats} other sampler seeds")
    print(f"\n{turned} of {len(repeats)} reruns of failing start states succeeded")
    reached = [*CUBE_COLORS, None]
    confusion = [
        {"instruction": f"reach the {named} cube",
         **{str(r or "none"): sum(e["named"] == named and e["reached"] == r for e in following) for r in reached}}
        for named in CUBE_COLORS
    ]  # fmt: skip
    followed = sum(e["reached"] == e["named"] for e in following)
    print_table(
        confusion, title=f"\nthe first {len(starts)} start states under each instruction: cube reached"
    )
    print(f"reached the named cube in {followed} of {len(following)}")
    figures = {
        "policy": cfg.policy,
        "episodes": cfg.episodes,
        "modes": counts,
        "success_rate": counts["success"] / cfg.episodes,
        "reruns": {"starts": len(failing), "per_start": cfg.repeats, "successes": turned},
        "per_start": per_start,
        "instruction_following": {
            "starts": len(starts),
            "reached_by_instruction": confusion,
            "reached_named": followed,
            "episodes": len(following),
        },
        "success_radius_m": REACH_RADIUS,
        "per_episode": episodes,
    }
    path = write_result(cfg.name or "policy_failure_modes", figures)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
