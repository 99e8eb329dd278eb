"""Does imagination rank policies like the simulator? A policy zoo evaluated in both from the same starts.

python benchmarks/imagination_eval.py --world_model=outputs/world_model/tiny/pretrained_model \
    --zoo=outputs/zoo --episodes=30 --task=reach

Every policy directory under `zoo` (any `*/pretrained_model` or directory holding a config.yaml) is run for
`episodes` episodes in the world model and in the simulator, both starting from the sim resets with seeds
`seed..seed+episodes-1`. Prints the per-policy table (imagined and sim success with Wilson intervals, gap,
wall time) and Pearson r, Spearman rho and MMRV; writes benchmarks/results/imagination_eval.json and the
scatter plot beside the run's ranking.json. Also measures imagination throughput (imagined env steps/s)
with and without the KV cache.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import print_table, write_result  # noqa: E402
from common.config import parse_cli  # noqa: E402
from rl_finetune.imagination_eval import ImaginationEvalConfig  # noqa: E402
from rl_finetune.policy_ranking import load_world_model_env, rank_policies, sim_starts  # noqa: E402
from vla.sim_evaluation import SimEvalConfig  # noqa: E402
from world_model.world_model_env import WorldModelEnv, WorldModelEnvConfig  # noqa: E402


@dataclass
class ImaginationEvalBenchmarkConfig:
    world_model: str = "outputs/world_model/tiny/pretrained_model"
    zoo: str = "outputs/zoo"  # a directory of policies; or list them in `policies`
    policies: list[str] | None = None
    task: str = "reach"
    episodes: int = 30
    seed: int = 100_000
    horizon: int = 50
    sampler_steps: int = 0
    batch_envs: int = 10
    output_dir: str = "outputs/benchmarks/imagination_eval"
    threads: int = 2
    # speed_only: no policies; imagined vs simulated env steps/s (batch `batch_envs`, no policy in the loop).
    # Without a trained checkpoint the world model is built with random weights from `world_model_config`'s
    # `model:` section: speed does not depend on the weights.
    speed_only: bool = False
    world_model_config: str = "configs/world_model/tiny.yaml"


def find_policies(zoo: Path) -> list[str]:
    found = sorted(
        {str(p.parent) for p in zoo.rglob("config.yaml") if (p.parent / "model.safetensors").is_file()}
    )
    # a training run holds checkpoints/*/pretrained_model as well as the final pretrained_model: keep the final
    return [p for p in found if "checkpoints" not in Path(p).parts]


def throughput(env: WorldModelEnv, starts, use_cache: bool, steps: int = 10) -> float:
    """Imagined env steps per second for a batch of `starts` (policy excluded: a fixed hold action)."""
    env = WorldModelEnv(
        env.world_model,
        WorldModelEnvConfig(horizon=steps, use_cache=use_cache, sampler_steps=env.config.sampler_steps),
    )
    env.reset(starts, seed=0)
    hold = starts.state.float()[:, None].repeat(1, 5, 1)
    t0 = time.perf_counter()
    while not env.done.all():
        env.step(hold)
    return starts.batch_size * steps / (time.perf_counter() - t0)


def sim_throughput(sim_cfg: SimEvalConfig, cameras: tuple[str, ...], image_size: int, episodes: int) -> float:
    """Simulated env steps per second (physics + rendering), one env after another, holding the arm still."""
    import gymnasium as gym

    import sim

    env = gym.make(
        sim.ENV_IDS[sim_cfg.task], image_size=image_size, cameras=cameras, max_steps=sim_cfg.max_steps
    )
    steps, t0 = 0, time.perf_counter()
    for e in range(episodes):
        obs, _ = env.reset(seed=e)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(obs["observation.state"])
            steps += 1
            done = terminated or truncated
    env.close()
    return steps / (time.perf_counter() - t0)


def speed_only(cfg: ImaginationEvalBenchmarkConfig) -> None:
    import tempfile

    import yaml

    from common.config import load_config
    from world_model.model import WorldModel, WorldModelConfig

    sim_cfg = SimEvalConfig(task=cfg.task, max_steps=cfg.horizon)
    if Path(cfg.world_model, "config.yaml").is_file():
        wm, source = WorldModel.from_pretrained(cfg.world_model), cfg.world_model
    else:
        model_section = yaml.safe_load(Path(cfg.world_model_config).read_text())["model"]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(model_section, f)
            wm = WorldModel(load_config(WorldModelConfig, f.name)).eval()
        source = f"random weights, model section of {cfg.world_model_config}"
    env = WorldModelEnv(wm, WorldModelEnvConfig(horizon=cfg.horizon, sampler_steps=cfg.sampler_steps))
    starts = sim_starts(env, sim_cfg, cfg.batch_envs, cfg.seed)
    rows = [
        {
            "backend": f"imagination, KV cache={c}",
            "batch": cfg.batch_envs,
            "env_steps_per_s": throughput(env, starts, c),
        }
        for c in (True, False)
    ]
    size = wm.cfg.dit.image_size
    rows.append(
        {
            "backend": "MuJoCo sim",
            "batch": 1,
            "env_steps_per_s": sim_throughput(sim_cfg, env.cameras, size, 4),
        }
    )
    print_table(
        rows, title=f"env steps / s without a policy ({source}; {size}x{size}, cameras {list(env.cameras)})"
    )
    figures = {
        "rows": rows,
        "world_model": source,
        "sampler_steps": env.config.sampler_steps or wm.cfg.sampler.steps,
    }
    figures["load_average_1_5_15min"] = os.getloadavg()  # the machine is shared: contention slows everything
    path = write_result("imagination_speed", figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


def main() -> None:
    cfg = parse_cli(ImaginationEvalBenchmarkConfig)
    torch.set_num_threads(cfg.threads)
    if cfg.speed_only:
        speed_only(cfg)
        return
    policies = cfg.policies or find_policies(Path(cfg.zoo))
    if len(policies) < 2:
        raise SystemExit(f"need at least 2 policies to rank; found {policies} under {cfg.zoo}")
    im_cfg = ImaginationEvalConfig(
        world_model=cfg.world_model, horizon=cfg.horizon, sampler_steps=cfg.sampler_steps,
        batch_envs=cfg.batch_envs, videos=2,
    )  # fmt: skip
    sim_cfg = SimEvalConfig(task=cfg.task, max_steps=cfg.horizon, batch_envs=cfg.batch_envs, videos=2)
    result = rank_policies(policies, im_cfg, sim_cfg, cfg.episodes, cfg.seed, Path(cfg.output_dir))
    rows = result["rows"]
    print_table(
        rows, title=f"{len(rows)} policies x {cfg.episodes} episodes ({cfg.task}), imagination vs sim"
    )
    r = result["ranking"]
    print(f"\nPearson r {r['pearson']:.3f}  Spearman rho {r['spearman']:.3f}  MMRV {r['mmrv']:.3f}")

    env = load_world_model_env(im_cfg, sim_cfg)
    starts = sim_starts(env, sim_cfg, cfg.batch_envs, cfg.seed)
    speed = {f"steps_per_s_cache_{c}": throughput(env, starts, c) for c in (True, False)}
    print_table([{"batch": cfg.batch_envs, **speed}], title="\nimagined env steps / s (no policy)")
    figures = {
        "ranking": r,
        "targets": {"spearman_min": 0.9, "mmrv_max": 0.05, "abs_gap_max": 0.15},
        "met": {
            "spearman": r["spearman"] >= 0.9,
            "mmrv": r["mmrv"] <= 0.05,
            "gap": r["max_abs_gap"] <= 0.15,
        },
        "policies": rows,
        "episodes_per_policy": cfg.episodes,
        "imagination_seconds": result["imagination_seconds"],
        "sim_seconds": result["sim_seconds"],
        "throughput": speed,
        "world_model": cfg.world_model,
        "scatter_png": str(Path(cfg.output_dir) / "imagined_vs_sim.png"),
    }
    figures["load_average_1_5_15min"] = os.getloadavg()  # the machine is shared: contention slows everything
    path = write_result("imagination_eval", figures, " ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
