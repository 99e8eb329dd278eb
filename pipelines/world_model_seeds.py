"""A change to the push world-model recipe over training seeds, from nothing by commands: what a lever needs
before it is kept (a gain counts when it holds across 3 seeds; docs/training.md).

push data -> the recipe's first phase for each first-phase seed -> its second phase (world_model/recipe.py) for
each seed, once as the recipe (the baseline) and once with the candidate's overrides after the recipe's ->
each model scored by `benchmarks/world_model_fidelity.py` on the push held-out windows -> the two arms compared
by `benchmarks/world_model_seeds.py` under the keep rule given up front (checked before anything trains).

    python -m worldloop.pipelines.world_model_seeds --name=mw10 --jobs=2 \\
        '--candidate=[--model.motion_loss_weight=10,--model.motion_loss_span=window]' \\
        '--keep_lower=[cube_error@30]' '--max_rise={idm_ratio@30: 0.2}' '--max_drop={cube_r: 0.05}'

Why this script: each such comparison was run by a scratch script of its own, lost with the session. Every
stage is a root script or benchmark run through the quickstart's stage runner and skipped when its output
exists; a training stage resumes from its last checkpoint, so an interrupted comparison continues where it
stopped. A model trained with other overrides than its stage's (a recipe changed since) stops the run instead of
being reused; a scoring older than its model is redone. With `--jobs=2` two stages run at a time, a core each,
each as soon as what it reads is done (on 2 cores two single-thread trainings went ~10% faster than one on both).

Models: `<models>/push_tf` (first-phase seed 0; `push_s<k>_tf` for seed k), `<models>/push_s<seed>_sr` (the
recipe) and `push_s<seed>_sr_<name>` (the candidate); results `benchmarks/results/world_model_fidelity_<model>.json`
and the comparison `benchmarks/results/world_model_seeds_push_<name>.json` (move them to docs/results/ when they
are logged: a later comparison reads a model's logged scoring there, and scores it anew only if it was trained
since); with `--score_first_phases=true` each first phase is scored too, `world_model_fidelity_push_tf.json`
and so on. A first phase is shared by both arms of its pair and by every candidate: only its seed sets it.
A candidate with `first_phase_candidate` overrides (a first-phase lever) trains its own first phase as well,
`push_tf_<name>` (`push_s<k>_tf_<name>`), and its second phase starts there; the baseline keeps the shared one.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import load_json
from worldloop.common.config import ConfigError
from worldloop.pipelines.quickstart import REPO, Stage, build_setting, resume_args
from worldloop.world_model.recipe import (
    SELF_ROLLOUT_PHASE_ARGS,
    SELF_ROLLOUT_STEPS,
    TEACHER_FORCING_PHASE_ARGS,
)

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
    first_phase_candidate: list[str] = field(default_factory=list)  # its own first phase's overrides, if any
    baseline: list[str] = field(default_factory=list)  # overrides of the baseline arm (usually none)
    seeds: list[int] = field(default_factory=lambda: [3, 4, 5])  # second-phase --train.seed of each pair
    first_phase_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # the first phase of each pair
    data_root: str = "outputs/data/push_wm"  # recorded here unless it holds a dataset already
    models: str = "outputs/world_model"
    root: str = ""  # stage logs and records; "" -> outputs/world_model_seeds/<name>
    # The keep rule, fixed before the runs (benchmarks/world_model_seeds.py's fields): the candidate is kept when
    # in every pair it is better on each keep_higher and keep_lower figure, and no guard moved past its allowance.
    keep_higher: list[str] = field(default_factory=list)
    keep_lower: list[str] = field(default_factory=list)
    max_rise: dict[str, float] = field(default_factory=dict)  # '--max_rise={idm_ratio@30: 0.2}'
    max_drop: dict[str, float] = field(default_factory=dict)  # '--max_drop={cube_r: 0.05}'
    # A pretrained_model dir whose IDM every scoring also reads action following with (figure
    # idm_ratio_referee@30): for a candidate trained against its own IDM (model.self_rollout_idm_weight).
    referee_idm: str = ""
    # Also score each first phase (the same scoring; for reading a first-phase lever's slope and cube figures
    # before the second phase moves them). Not part of the comparison.
    score_first_phases: bool = False
    jobs: int = 1  # stages run this many at a time, OMP_NUM_THREADS = cores // jobs each
    force: bool = False  # redo stages whose outputs exist

    def validate(self) -> None:
        if not self.name or Path(self.name).name != self.name or self.name in ("tf", "sr"):
            raise ConfigError(f"name={self.name!r}: expected a short plain name for the candidate's models")
        if not self.candidate and not self.first_phase_candidate:
            raise ConfigError("candidate / first_phase_candidate: the overrides that make the candidate differ from "
                              "the recipe, e.g. '--candidate=[--model.motion_loss_weight=10]'")  # fmt: skip
        overrides = (*self.candidate, *self.first_phase_candidate, *self.baseline)
        if bad := [a for a in overrides if not a.startswith("--")]:
            raise ConfigError(
                f"candidate / first_phase_candidate / baseline: {bad} are not --key=value overrides"
            )
        if not self.seeds or len(self.seeds) != len(self.first_phase_seeds):
            raise ConfigError(
                f"seeds={self.seeds} and first_phase_seeds={self.first_phase_seeds}: one first phase per seed, "
                "at least one pair"
            )
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds={self.seeds}: each pair needs a seed of its own")
        if not self.keep_higher and not self.keep_lower:
            raise ConfigError("keep_higher / keep_lower: the keep rule names at least one figure the candidate must "
                              "win in every pair, e.g. '--keep_lower=[cube_error@30]' (fixed before the runs)")  # fmt: skip
        if self.jobs < 1:
            raise ConfigError(f"jobs={self.jobs}: expected >= 1")
        self.root = self.root or f"outputs/world_model_seeds/{self.name}"


def first_phase_name(seed: int) -> str:
    return "push_tf" if seed == 0 else f"push_s{seed}_tf"


def first_phase_names(cfg: WorldModelSeedsConfig, seed: int) -> tuple[str, str]:
    """(baseline, candidate) first phases of first-phase seed `seed`: one shared model unless the candidate has
    first-phase overrides of its own."""
    shared = first_phase_name(seed)
    return shared, f"{shared}_{cfg.name}" if cfg.first_phase_candidate else shared


def arm_names(cfg: WorldModelSeedsConfig, seed: int) -> tuple[str, str]:
    """(baseline, candidate) model names of the pair trained on `seed`."""
    return f"push_s{seed}_sr", f"push_s{seed}_sr_{cfg.name}"


def result_json(name: str) -> str:
    """Where a benchmark run with `--name=<name>` writes (relative to the repository)."""
    return f"benchmarks/results/{name}.json"


def training_record(models: Path, model: str) -> Path:
    """The file a training stage writes last (its done marker), which a scoring of the model reads as its input."""
    return models / model / "pretrained_model" / "training.json"


def fidelity_json(model: str, models: Path) -> str:
    """Where the scoring of `model` is read (relative to the repository): its logged copy in docs/results/ where
    one exists, benchmarks/results/ holds none, and the model in `models` is older than that copy (it is what
    was scored); else where the scoring writes. So a comparison run again after its results were logged reads
    them instead of scoring the baseline anew, while a model trained since is scored anew."""
    current = result_json(f"world_model_fidelity_{model}")
    logged = Path("docs/results") / Path(current).name
    trained = training_record(models, model)
    if (
        not (REPO / current).is_file()
        and (REPO / logged).is_file()
        and trained.is_file()
        and trained.stat().st_mtime <= (REPO / logged).stat().st_mtime
    ):
        return str(logged)
    return current


def under_repo(path: str) -> Path:
    """`path` as an absolute path: a relative one is taken under the repository, an absolute one kept (pathlib's
    `/` does both), so that whether a stage is done does not depend on where the pipeline was started."""
    return REPO / path


def stages(cfg: WorldModelSeedsConfig, root: Path) -> list[Stage]:
    """The rule's check, the data, the first phases, each pair's two trainings, the scorings, the comparison.
    With `jobs` > 1 a stage starts as soon as what it reads is done, so a pair trains while later first phases
    still run."""
    models, data = under_repo(cfg.models), under_repo(cfg.data_root)
    referee = [f"--referee_idm={under_repo(cfg.referee_idm).resolve()}"] if cfg.referee_idm else []
    threads = max(1, (os.cpu_count() or 1) // cfg.jobs)
    launcher = [sys.executable] if cfg.jobs == 1 else ["env", f"OMP_NUM_THREADS={threads}", sys.executable]
    record = Stage(
        "record push data",
        "record_demos.py",
        [*PUSH_DATA_ARGS, f"--root={data}", "--repo_id=worldloop/push_wm"],
        data / "meta" / "recording.json",  # written when the recording ends
        data,
        needs=("check the keep rule",),
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
            training_record(models, name),  # written last, after the calibrations
            out / "pretrained_model",
            launcher=launcher,
            needs=(record.name, *needs),
        )

    def score(model: str) -> Stage:
        scored = REPO / fidelity_json(model, models)
        return Stage(
            f"score {model}",
            "benchmarks/world_model_fidelity.py",
            [
                f"--model_path={models / model / 'pretrained_model'}",
                f"--dataset.root={data}",
                *FIDELITY_ARGS,
                *referee,
                f"--name=world_model_fidelity_{model}",
            ],  # fmt: skip
            scored,
            scored,
            launcher=launcher,
            needs=(f"train {model}",),
            inputs=(training_record(models, model),),  # a model trained anew is scored anew
        )

    # The first phase's own evaluation and calibrations are skipped: the second phase calibrates its model, and
    # the weights it starts from are the same either way.
    skip_evals = ["--eval.max_windows=0", "--calibrate_success=false", "--still_windows=0"]
    trainings, first_scores = [], []
    for s in dict.fromkeys(cfg.first_phase_seeds):
        shared, own = first_phase_names(cfg, s)
        first_args = [*TEACHER_FORCING_PHASE_ARGS, f"--train.seed={s}", *skip_evals]
        trainings.append(train(shared, (), first_args))
        if own != shared:
            trainings.append(train(own, (), [*first_args, *cfg.first_phase_candidate]))
        if cfg.score_first_phases:
            first_scores += [score(m) for m in dict.fromkeys((shared, own))]
    scores = []
    for seed, first in zip(cfg.seeds, cfg.first_phase_seeds):
        pair = arm_names(cfg, seed)
        for model, start, extra in zip(pair, first_phase_names(cfg, first), (cfg.baseline, cfg.candidate)):
            recipe = [f"--init_from={models / start / 'pretrained_model'}", f"--train.steps={SELF_ROLLOUT_STEPS}",
                      *SELF_ROLLOUT_PHASE_ARGS, f"--train.seed={seed}"]  # fmt: skip
            trainings.append(train(model, (f"train {start}",), [*recipe, *extra]))
        scores += [score(m) for m in pair]
    if stale := [m for st in (*trainings, *scores, *first_scores) if (m := trained_otherwise(st))]:
        raise SystemExit(
            "models trained, or scored, otherwise than these stages would (they are not overwritten: move them "
            "away to redo them, or give --models=<another folder>):\n  " + "\n  ".join(stale)
        )
    # Scorings listed after every training: with jobs > 1 a free core takes a training first (the long pole), and
    # the minutes-long scorings fill in at the end.
    return [comparison(cfg, check_only=True), record, *trainings, *scores,
            comparison(cfg, needs=tuple(s.name for s in scores)), *first_scores]  # fmt: skip


def trained_otherwise(stage: Stage) -> str:
    """For a training or scoring stage whose output exists: how the overrides it ran with (the command in its
    training.json or result JSON; the last of a repeated key wins, `--output_dir` and `--resume` aside) differ
    from the stage's, as `<output>: --key=<was> -> <now>, ...`; "" where they match or nothing exists yet. A recipe
    (or a scoring) that changed since would otherwise be compared by the old output, since a stage whose output
    exists is skipped."""
    if not stage.done_marker.is_file():
        return ""
    was = _overrides(shlex.split(load_json(stage.done_marker)["command"])[2:])
    now = _overrides(stage.args)
    changed = [f"--{k}={was.get(k, '<unset>')} -> {now.get(k, '<unset>')}"
               for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)]  # fmt: skip
    return f"{stage.produced}: {', '.join(changed)}" if changed else ""


def _overrides(args: list[str]) -> dict[str, str]:
    out = {}
    for arg in args:
        key, _, value = arg.removeprefix("--").partition("=")
        # a path given relative to the repository and the same path given absolute are one
        out[key] = str((REPO / value).resolve()) if value and (REPO / value).exists() else value
    for key in ("output_dir", "resume"):
        out.pop(key, None)
    return out


def comparison(cfg: WorldModelSeedsConfig, check_only: bool = False, needs: tuple[str, ...] = ()) -> Stage:
    """`benchmarks/world_model_seeds.py` over the pairs with the keep rule: run first with `check_only` (a rule
    that names an unknown figure stops the pipeline before any training), and last on the scores."""
    pairs = [arm_names(cfg, s) for s in cfg.seeds]
    models = under_repo(cfg.models)
    result = REPO / result_json(comparison_name(cfg))
    return Stage(
        "check the keep rule" if check_only else "compare the arms",
        "benchmarks/world_model_seeds.py",
        [
            f"--baseline=[{','.join(fidelity_json(b, models) for b, _ in pairs)}]",
            f"--candidate=[{','.join(fidelity_json(c, models) for _, c in pairs)}]",
            f"--keep_higher=[{','.join(cfg.keep_higher)}]",
            f"--keep_lower=[{','.join(cfg.keep_lower)}]",
            f"--max_rise={{{', '.join(f'{k}: {v}' for k, v in cfg.max_rise.items())}}}",
            f"--max_drop={{{', '.join(f'{k}: {v}' for k, v in cfg.max_drop.items())}}}",
            f"--name={comparison_name(cfg)}",
            *(["--check_only=true"] if check_only else []),
        ],
        # the check writes nothing, so it runs every time
        result.with_suffix(".checked") if check_only else result,
        None if check_only else result,
        needs=needs,
    )


def comparison_name(cfg: WorldModelSeedsConfig) -> str:
    return f"world_model_seeds_push_{cfg.name}"


def main() -> None:
    cfg, _, records = build_setting(WorldModelSeedsConfig, stages)
    result = REPO / result_json(comparison_name(cfg))
    kept = load_json(result)["figures"]["kept"]
    print(f"\n{sum(r.seconds for r in records) / 60:.1f} min of stage time; candidate {cfg.name} "
          f"{'kept' if kept else 'not kept'} by the rule: {result.relative_to(REPO)}")  # fmt: skip


if __name__ == "__main__":
    main()
