"""A zoo of policies of graded sim success, for ranking policies by imagination evaluation later.

The candidates are the training snapshots (checkpoints/<step>/pretrained_model) of BC runs: early
snapshots and runs on fewer demonstrations act worse than late ones on more, which spreads success
widely at no extra training cost. Each candidate is evaluated in the sim on the same seeds, copied to
`<zoo_dir>/<name>/`, and listed with its measured success in `<zoo_dir>/zoo.json`.

python benchmarks/policy_bc_success.py --output_root=outputs/bench/policy_bc_v3   # trains the 20/60/360ep runs
python -m worldloop.pipelines.policy_zoo

Writes `<zoo_dir>/zoo.json` (the zoo) and `<zoo_dir>/summary.json` (the zoo's figures with the command,
the machine and the date).

Every policy reads only the cameras in `cameras` (default: front, the one the world model draws), so
the whole zoo can be evaluated in imagination.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import load_json, save_json
from worldloop.common.config import ConfigError, parse_cli
from worldloop.common.run_record import print_table, write_run_record
from worldloop.vla.factory import load_policy
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim


@dataclass
class ZooConfig:
    runs: list[str] = field(
        default_factory=lambda: [
            "outputs/bench/policy_bc_v3/20ep",
            "outputs/bench/policy_bc_v3/60ep",
            "outputs/bench/policy_bc_v3/360ep",
        ]
    )
    # Training steps whose snapshots are taken from every run (each must have been checkpointed).
    steps: list[int] = field(default_factory=lambda: [100, 300, 400, 500, 600, 2000])
    cameras: list[str] = field(default_factory=lambda: ["front"])
    eval_episodes: int = 30
    eval_seed: int = 200_000  # not the BC benchmark's seeds
    sim: SimEvalConfig = field(default_factory=lambda: SimEvalConfig(videos=0))
    zoo_dir: str = "outputs/zoo"
    min_policies: int = 6


def _snapshots(run: Path, steps: list[int]) -> list[Path]:
    snaps = [run / "checkpoints" / f"{step:07d}" / "pretrained_model" for step in steps]
    missing = [str(p) for p in snaps if not p.is_dir()]
    if missing:
        raise ConfigError(
            f"{run}: no snapshot {missing}; train it first with checkpoints at steps {steps} "
            "(policy_bc_success.py keeps every checkpoint)"
        )
    return snaps


def _train_episodes(run: Path) -> int:
    return len(load_json(run / "episodes.json")["train"])


def main() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(ZooConfig)
    zoo_dir = Path(cfg.zoo_dir)
    entries = []
    for run in map(Path, cfg.runs):
        for snap in _snapshots(run, cfg.steps):
            step = int(snap.parent.name)
            name = f"{run.name}_step{step:05d}"
            policy = load_policy(snap)
            if list(policy.config.cameras) != list(cfg.cameras):
                raise ConfigError(
                    f"{snap} reads cameras {list(policy.config.cameras)}, the zoo wants {cfg.cameras}"
                )
            summary = evaluate_in_sim(policy, cfg.sim, cfg.eval_episodes, cfg.eval_seed)
            target = zoo_dir / name
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(snap, target)
            lo, hi = summary["success_ci95"]
            entries.append(
                {
                    "name": name,
                    "path": str(target),
                    "source": str(snap),
                    "policy": policy.name,
                    "train_step": step,
                    "train_episodes": _train_episodes(run),
                    "success_rate": summary["success_rate"],
                    "ci95_low": round(lo, 3),
                    "ci95_high": round(hi, 3),
                    "mean_progress": round(summary["mean_progress"], 3),
                    "eval_episodes": summary["episodes"],
                }
            )
            print(f"{name}: success {summary['success_rate']:.0%}, progress {summary['mean_progress']:.3f}")
    entries.sort(key=lambda e: e["success_rate"])
    zoo = {
        "task": cfg.sim.task,
        "eval_seed": cfg.eval_seed,
        "eval_episodes": cfg.eval_episodes,
        "policies": entries,
    }
    save_json(zoo, zoo_dir / "zoo.json")
    print_table(
        [
            {k: e[k] for k in ("name", "success_rate", "ci95_low", "ci95_high", "mean_progress")}
            for e in entries
        ]
    )
    rates = [e["success_rate"] for e in entries]
    figures = {**zoo, "count": len(entries), "min_success": min(rates), "max_success": max(rates)}
    summary = write_run_record(zoo_dir / "summary.json", "policy_zoo", figures)
    print(f"wrote {zoo_dir / 'zoo.json'} and {summary}")
    if len(entries) < cfg.min_policies:
        raise SystemExit(f"only {len(entries)} policies in the zoo, wanted at least {cfg.min_policies}")


if __name__ == "__main__":
    main()
