"""How often hindsight relabelling is right: the success head judging imagined episodes under every
instruction, against the simulator's own reach rule on the same imagined joint states.

    python benchmarks/hindsight_relabelling.py --policy=outputs/zoo/60ep_step00600 \
        --world_model=outputs/world_model/tiny_af0_first_state/pretrained_model --episodes=64

NFT with hindsight (rl_finetune/policy_rl/nft/nft.py) learns an imagined episode again under each instruction
whose success the heads see in it. The joint states of an imagined episode are exact (integrated from
the commanded actions), so the sim's rule (`TabletopEnv.success_along`, with `reset(options={"cube": ...})`
naming each cube in the start's scene) says whether the arm really reached that cube. Reach only. Prints
the agreement over (episode, instruction) pairs, for the episode's own instruction and for the others (the
relabelling), and writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result  # noqa: E402
from worldloop.common.config import parse_cli  # noqa: E402
from worldloop.common.rng import torch_seeded  # noqa: E402
from worldloop.common.run_record import print_table  # noqa: E402
from worldloop.rl_finetune.imagination.initial_states import from_sim_resets  # noqa: E402
from worldloop.sim.scene import CUBE_COLORS  # noqa: E402
from worldloop.vla.factory import load_policy  # noqa: E402
from worldloop.world_model.model import WorldModel  # noqa: E402
from worldloop.world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig  # noqa: E402


@dataclass
class HindsightRelabellingConfig:
    policy: str = "outputs/zoo/60ep_step00600"
    world_model: str = "outputs/world_model/tiny_af0_first_state/pretrained_model"
    episodes: int = 64
    seed: int = 300_000  # sim seeds of the start states
    horizon: int = 50  # imagined steps per episode (episodes run to it: every instruction is judged)
    batch: int = 16
    success_threshold: float = 0.0  # 0 -> the world model's calibrated one
    threads: int = 2
    name: str = "hindsight_relabelling"


def agreement(heads: np.ndarray, sim: np.ndarray) -> dict:
    """Heads' verdicts against the sim's over pairs: counts, precision, recall, balanced accuracy."""
    tp, fp = int((heads & sim).sum()), int((heads & ~sim).sum())
    fn, tn = int((~heads & sim).sum()), int((~heads & ~sim).sum())
    recall = tp / max(tp + fn, 1)
    return {"pairs": int(heads.size), "sim_reached": tp + fn, "heads_said": tp + fp,
            "precision": tp / max(tp + fp, 1), "recall": recall,
            "balanced_accuracy": (recall + tn / max(tn + fp, 1)) / 2}  # fmt: skip


@torch.no_grad()
def main() -> None:
    from worldloop.sim.tabletop_env import TabletopEnv

    cfg = parse_cli(HindsightRelabellingConfig)
    torch.set_num_threads(cfg.threads)
    wm = WorldModel.from_pretrained(cfg.world_model).eval()
    env_cfg = WorldModelEnvConfig(
        horizon=cfg.horizon, terminate_on_success=False, success_threshold=cfg.success_threshold
    )
    env = WorldModelEnv(wm, env_cfg)
    policy = load_policy(cfg.policy).eval()
    sim_env = TabletopEnv(task="reach", image_size=wm.cfg.dit.image_size, cameras=tuple(env.cameras))
    instructions = [f"reach the {c} cube" for c in CUBE_COLORS]
    seeds = list(range(cfg.seed, cfg.seed + cfg.episodes))
    heads_hit, sim_hit, own = [], [], []
    try:
        for first in range(0, len(seeds), cfg.batch):
            group = seeds[first : first + cfg.batch]
            starts = from_sim_resets(sim_env, group, tuple(env.cameras))
            with torch_seeded(first):
                obs = env.reset(starts, seed=first)
                paths = [starts.state.numpy()[:, None]]
                hit = np.zeros((len(group), len(instructions)), dtype=bool)
                while not env.done.all():
                    chunk = policy.predict_action_chunk(obs)[:, : policy.n_action_steps]
                    obs, _, _, _, info = env.step(chunk)
                    paths.append(info["state"].cpu().numpy())
                    for i, text in enumerate(instructions):
                        prob = env.success_prob(info, [text] * len(group))
                        hit[:, i] |= (prob > env.success_threshold).any(1).cpu().numpy()
            path = np.concatenate(paths, 1)  # [B, T, J]
            for b, seed in enumerate(group):
                row = []
                for cube in CUBE_COLORS:
                    sim_env.reset(seed=seed, options={"cube": cube})
                    row.append(sim_env.success_along(path[b]))
                sim_hit.append(row)
                own.append([starts.task[b] == text for text in instructions])
            heads_hit += hit.tolist()
    finally:
        sim_env.close()
    heads, sim, named = np.array(heads_hit), np.array(sim_hit), np.array(own)
    rows = [
        {"instruction": "own", **agreement(heads[named], sim[named])},
        {"instruction": "others (relabelling)", **agreement(heads[~named], sim[~named])},
    ]
    print_table(rows, title=f"heads vs the sim's rule on imagined states, {cfg.episodes} episodes")
    figures = {"policy": cfg.policy, "world_model": cfg.world_model, "episodes": cfg.episodes,
               "success_threshold": env.success_threshold, "rows": rows}  # fmt: skip
    path = write_result(cfg.name, figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
