"""A zoo of policies of graded sim success, for ranking policies by imagination evaluation later.

The candidates are the training snapshots (checkpoints/<step>/pretrained_model) of BC runs: early
snapshots and runs on fewer demonstrations act worse than late ones on more, which spreads success
widely at no extra training cost. Each candidate is evaluated in the sim on the same seeds, copied to
`<zoo_dir>/<name>/`, and listed with its measured success in `<zoo_dir>/zoo.json`.

python benchmarks/policy_bc_success.py          # trains the 20ep / 60ep runs (or pass --runs of your own)
python train_policy.py --config configs/policy/tiny.yaml --train.steps=600 --train.checkpoint_every=100 \
    --train.keep_checkpoints=100 --output_dir=outputs/bench/policy_bc/180ep_600steps
python benchmarks/make_policy_zoo.py --eval_episodes=20
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import print_table, write_result  # noqa: E402
from common.checkpoint import save_json  # noqa: E402
from common.config import ConfigError, parse_cli  # noqa: E402
from vla.factory import load_policy  # noqa: E402
from vla.sim_evaluation import SimEvalConfig, evaluate_in_sim  # noqa: E402


@dataclass
class ZooConfig:
    runs: list[str] = field(
        default_factory=lambda: [
            "outputs/bench/policy_bc/20ep",
            "outputs/bench/policy_bc/60ep",
            "outputs/bench/policy_bc/180ep_600steps",
        ]
    )
    # Snapshots per run, spread evenly over its checkpoints (the last one always included); 0 = all.
    per_run: int = 3
    eval_episodes: int = 30
    eval_seed: int = 200_000  # not the BC benchmark's seeds
    sim: SimEvalConfig = field(default_factory=lambda: SimEvalConfig(videos=0))
    zoo_dir: str = "outputs/zoo"
    min_policies: int = 6


def _snapshots(run: Path, per_run: int) -> list[Path]:
    ckpts = sorted(
        p / "pretrained_model"
        for p in (run / "checkpoints").glob("[0-9]*")
        if (p / "pretrained_model").is_dir()
    )
    if not ckpts:
        raise ConfigError(
            f"{run}: no checkpoints/<step>/pretrained_model; train it first (policy_bc_success.py)"
        )
    if per_run <= 0 or per_run >= len(ckpts):
        return ckpts
    # Evenly spaced indices ending at the last checkpoint.
    step = (len(ckpts) - 1) / (per_run - 1) if per_run > 1 else 0
    picks = sorted({round(len(ckpts) - 1 - i * step) for i in range(per_run)})
    return [ckpts[i] for i in picks]


def main() -> None:
    os.environ.setdefault("MUJOCO_GL", "egl")
    cfg = parse_cli(ZooConfig)
    zoo_dir = Path(cfg.zoo_dir)
    entries = []
    for run in map(Path, cfg.runs):
        for snap in _snapshots(run, cfg.per_run):
            step = int(snap.parent.name)
            name = f"{run.name}_step{step:05d}"
            policy = load_policy(snap)
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
    print(f"wrote {zoo_dir / 'zoo.json'} and {write_result('policy_zoo', figures)}")
    if len(entries) < cfg.min_policies:
        raise SystemExit(f"only {len(entries)} policies in the zoo, wanted at least {cfg.min_policies}")


if __name__ == "__main__":
    main()
