"""A change to the push world-model recipe over training seeds, from nothing by commands: what a lever needs
before it is kept (a gain counts when it holds across 3 seeds; docs/training.md).

push data -> the recipe's first phase for each first-phase seed -> its second phase (world_model/recipe.py) for
each seed, once as the recipe (the baseline) and once with the candidate's overrides after the recipe's ->
each model scored by `benchmarks/world_model_fidelity.py` on the push held-out windows -> the printed
`benchmarks/world_model_seeds.py` command, to which the protocol's keep rule is added.

    python -m worldloop.pipelines.world_model_seeds --name=mw10 --jobs=2 \\
        '--candidate=[--model.motion_loss_weight=10,--model.motion_loss_span=window]'

Why this script: each such comparison was run by a scratch script of its own, lost with the session. Every
stage is a root script or benchmark run through the quickstart's stage runner and skipped when its output
exists; a training stage resumes from its last checkpoint, so an interrupted comparison continues where it
stopped. With `--jobs=2` two stages run at a time, a core each, each as soon as what it reads is done (on 2 cores
two single-thread trainings went ~10% faster than one on both).

Models: `<models>/push_tf` (first-phase seed 0; `push_s<k>_tf` for seed k), `<models>/push_s<seed>_sr` (the
recipe) and `push_s<seed>_sr_<name>` (the candidate); results `benchmarks/results/world_model_fidelity_<model>.json`
(move them to docs/results/ when they are logged). A first phase is shared by both arms of its pair and by
every candidate: only its seed sets it.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.config import ConfigError
from worldloop.pipelines.quickstart import REPO, Stage, build_setting, resume_args
from worldloop.world_model.recipe import SELF_ROLLOUT_PHASE_ARGS, SELF_ROLLOUT_STEPS

# The push data of every recipe figure (docs/experiments.md, 2026-11-28): mixed skill, failures kept, the
# cubes' state recorded for the tracker.
PUSH_DATA_ARGS = (
    "--task=push",
    "--episodes=400",
    "--skill_range=[0.0, 1.0]",
    "--cameras=[front]",
    "--terminate_on_success=false",
    "--environment_state=true",
)
# The current push fidelity figure's scoring (benchmarks/results/world_model_fidelity_push.json), without its
# strips and speed timings.
FIDELITY_ARGS = (
    "--eval.max_windows=64",
    "--sweep_steps=[2]",
    "--sweep_windows=8",
    "--cache_horizon=10",
    "--cache_batch=1",
    "--train_steps=0",
    "--threads=1",
    "--group_size=4",
    "--group_windows=16",
)


@dataclass
class WorldModelSeedsConfig:
    name: str = ""  # the candidate's short name: its models are push_s<seed>_sr_<name>
    candidate: list[str] = field(default_factory=list)  # its second-phase overrides, after the recipe's
    baseline: list[str] = field(default_factory=list)  # overrides of the baseline arm (usually none)
    seeds: list[int] = field(default_factory=lambda: [3, 4, 5])  # second-phase --train.seed of each pair
    first_phase_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # the first phase of each pair
    data_root: str = "outputs/data/push_wm"  # recorded here unless it holds a dataset already
    models: str = "outputs/world_model"
    root: str = ""  # stage logs and records; "" -> outputs/world_model_seeds/<name>
    jobs: int = 1  # stages of one kind run this many at a time, OMP_NUM_THREADS = cores // jobs each
    force: bool = False  # redo stages whose outputs exist

    def validate(self) -> None:
        if not self.name or Path(self.name).name != self.name or self.name in ("tf", "sr"):
            raise ConfigError(f"name={self.name!r}: expected a short plain name for the candidate's models")
        if not self.candidate:
            raise ConfigError("candidate: the overrides that make the candidate differ from the recipe, e.g. "
                              "'--candidate=[--model.motion_loss_weight=10]'")  # fmt: skip
        if bad := [a for a in (*self.candidate, *self.baseline) if not a.startswith("--")]:
            raise ConfigError(f"candidate / baseline: {bad} are not --key=value overrides")
        if not self.seeds or len(self.seeds) != len(self.first_phase_seeds):
            raise ConfigError(
                f"seeds={self.seeds} and first_phase_seeds={self.first_phase_seeds}: one first phase per seed, "
                "at least one pair"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds={self.seeds}: each pair needs a seed of its own")
        if self.jobs < 1:
            raise ConfigError(f"jobs={self.jobs}: expected >= 1")
        self.root = self.root or f"outputs/world_model_seeds/{self.name}"


def first_phase_name(seed: int) -> str:
    return "push_tf" if seed == 0 else f"push_s{seed}_tf"


def arm_names(cfg: WorldModelSeedsConfig, seed: int) -> tuple[str, str]:
    """(baseline, candidate) model names of the pair trained on `seed`."""
    return f"push_s{seed}_sr", f"push_s{seed}_sr_{cfg.name}"


def fidelity_json(model: str) -> str:
    """Where the scoring of `model` writes (relative to the repository)."""
    return f"benchmarks/results/world_model_fidelity_{model}.json"


def stages(cfg: WorldModelSeedsConfig, root: Path) -> list[Stage]:
    """The data, the first phases, then each pair's two trainings and their scorings. With `jobs` > 1 a stage
    starts as soon as what it reads is done, so a pair trains while later first phases still run."""
    # Absolute, so that whether a stage is done does not depend on where the pipeline was started.
    models, data = (Path(p) if Path(p).is_absolute() else REPO / p for p in (cfg.models, cfg.data_root))
    threads = max(1, (os.cpu_count() or 1) // cfg.jobs)
    launcher = [sys.executable] if cfg.jobs == 1 else ["env", f"OMP_NUM_THREADS={threads}", sys.executable]
    record = Stage(
        "record push data",
        "record_demos.py",
        [*PUSH_DATA_ARGS, f"--root={data}", "--repo_id=worldloop/push_wm"],
        data / "meta" / "recording.json",  # written when the recording ends
        data,
        needs=(),
    )

    def train(name: str, needs: tuple[str, ...], args: list[str]) -> Stage:
        out = models / name
        return Stage(
            f"train {name}",
            "train_world_model.py",
            [
                "--config=configs/world_model/tiny.yaml",
                f"--dataset.root={data}",
                f"--output_dir={out}",
                *args,
                *resume_args(out),
            ],  # fmt: skip
            out / "pretrained_model" / "training.json",  # written last, after the calibrations
            out / "pretrained_model",
            launcher=launcher,
            needs=(record.name, *needs),
        )

    def score(model: str) -> Stage:
        return Stage(
            f"score {model}",
            "benchmarks/world_model_fidelity.py",
            [
                f"--model_path={models / model / 'pretrained_model'}",
                f"--dataset.root={data}",
                *FIDELITY_ARGS,
                f"--name=world_model_fidelity_{model}",
            ],  # fmt: skip
            REPO / fidelity_json(model),
            REPO / fidelity_json(model),
            launcher=launcher,
            needs=(f"train {model}",),
        )

    # The first phase's own evaluation and calibrations are skipped: the second phase calibrates its model, and
    # the weights it starts from are the same either way.
    skip_evals = ["--eval.max_windows=0", "--calibrate_success=false", "--still_windows=0"]
    out = [record, *(train(first_phase_name(s), (), [f"--train.seed={s}", *skip_evals])
                     for s in dict.fromkeys(cfg.first_phase_seeds))]  # fmt: skip
    for seed, first in zip(cfg.seeds, cfg.first_phase_seeds):
        init = models / first_phase_name(first) / "pretrained_model"
        recipe = [f"--init_from={init}", f"--train.steps={SELF_ROLLOUT_STEPS}", *SELF_ROLLOUT_PHASE_ARGS,
                  f"--train.seed={seed}"]  # fmt: skip
        pair = arm_names(cfg, seed)
        out += [train(m, (f"train {first_phase_name(first)}",), [*recipe, *extra])
                for m, extra in zip(pair, (cfg.baseline, cfg.candidate))]  # fmt: skip
        out += [score(m) for m in pair]
    return out


def comparison_command(cfg: WorldModelSeedsConfig) -> str:
    """The `benchmarks/world_model_seeds.py` command over the pairs; the protocol's keep rule is added to it."""
    pairs = [arm_names(cfg, s) for s in cfg.seeds]
    return shlex.join(
        [
            "python",
            "benchmarks/world_model_seeds.py",
            f"--baseline=[{','.join(fidelity_json(b) for b, _ in pairs)}]",
            f"--candidate=[{','.join(fidelity_json(c) for _, c in pairs)}]",
            f"--name=world_model_seeds_push_{cfg.name}",
        ]
    )


def main() -> None:
    cfg, root, records = build_setting(WorldModelSeedsConfig, stages)
    print(f"\n{sum(r.seconds for r in records) / 60:.1f} min of stage time; compare the arms with the protocol's "
          f"rule (--keep_higher, --keep_lower, --max_rise, --max_drop) added:\n  {comparison_command(cfg)}")  # fmt: skip


if __name__ == "__main__":
    main()
