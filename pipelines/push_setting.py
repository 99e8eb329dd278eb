"""What the push imagination figures need beside a push world model, made from nothing by commands.

expert demos (skill 1.0) -> held-out replays for the judge -> the judge's data: scripted episodes of graded
skill, then episodes of policies trained apart from the zoo (their failures: the wrong cube pushed, a cube
nudged short) -> the drawn-frame judge: outcome heads fitted on the world model's rollouts of that data -> the
zoo: FlowVLA, LeRobot ACT and LeRobot Diffusion snapshots of graded sim success, fixed before any evaluation.

Why this script: the push judge, ranking and RL figures (docs/experiments.md, issue 25) quote a judge, a zoo and
a BC policy by path; rebuilding them by hand from the log took a session. Each stage runs a root script through
the quickstart's stage runner and is skipped when its output exists, so an interrupted build resumes. A new
world model needs only the judge stage again: its heads go to `<root>/judge/<world model's run name>`.

Seeds, each range apart from the others and from the benchmarks' starts: expert demos 20,000+, the judge's
scripted episodes 1,000,000+ (earlier builds used 100,000+, the zoo ranking's own starts), its policies'
episodes 400,000+, replays 900,000+; the ranking starts at 100,000 and RL's sim evaluation at 200,000.

python -m worldloop.pipelines.push_setting --world_model=outputs/world_model/push_sr/pretrained_model
then the benchmark commands it prints. Writes `<root>/setting.json` (the paths) and `<root>/summary.json`
(stage times, with the command, the machine and the date).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import save_json
from worldloop.common.config import ConfigError
from worldloop.common.run_record import print_table, write_run_record
from worldloop.pipelines.quickstart import Stage, build_setting, resume_args


@dataclass
class PolicyRun:
    """One BC run: a policy config trained for `steps`, snapshots every `checkpoint_every` steps."""

    config: str  # configs/policy/<name>.yaml
    steps: int
    checkpoint_every: int


# The BC runs snapshots are taken from: the zoo's with train seed 0, the judge's with seed 1 (not the zoo's
# policies, so the judge is not fitted on the failures it will be asked to rank).
RUNS = {
    "flow_4k": PolicyRun("configs/policy/tiny.yaml", 4000, 1000),
    "flow_10k": PolicyRun("configs/policy/tiny.yaml", 10000, 2000),
    "act": PolicyRun("configs/policy/act_tiny.yaml", 1000, 200),
    "diffusion": PolicyRun("configs/policy/diffusion_tiny.yaml", 1000, 200),
}


@dataclass
class PushSettingConfig:
    world_model: str = ""  # the push world model the judge's heads are fitted on (a pretrained_model dir)
    root: str = "outputs/push_setting"
    expert_episodes: int = 400
    expert_seed: int = 20_000
    replay_episodes: int = 200
    replay_seed: int = 900_000
    judge_scripted_episodes: int = 1200
    judge_scripted_seed: int = 1_000_000
    judge_policy_episodes: int = 50  # per judge-training snapshot
    judge_policy_seed: int = 400_000
    judge_steps: int = 4000
    # "<run>:<step>" snapshots of RUNS: the zoo (8 graded policies), and the judge policies whose episodes it learns from.
    zoo: list[str] = field(
        default_factory=lambda: [
            "flow_4k:1000",
            "flow_4k:2000",
            "flow_4k:3000",
            "flow_4k:4000",
            "flow_10k:10000",
            "act:200",
            "act:1000",
            "diffusion:1000",
        ]
    )
    judge_policies: list[str] = field(
        default_factory=lambda: [
            "flow_4k:1000",
            "flow_4k:2000",
            "flow_4k:3000",
            "flow_4k:4000",
            "act:200",
            "act:600",
            "act:1000",
            "diffusion:400",
            "diffusion:1000",
        ]
    )
    force: bool = False  # redo stages whose outputs exist

    def validate(self) -> None:
        if not self.world_model:
            raise ConfigError("world_model is required: the push world model's pretrained_model directory")
        if not (Path(self.world_model) / "model.safetensors").is_file():
            raise ConfigError(f"world_model: {self.world_model} holds no model.safetensors")
        for key, snaps in (("zoo", self.zoo), ("judge_policies", self.judge_policies)):
            for snap in snaps:
                run, _, step = snap.partition(":")
                if run not in RUNS or not step.isdigit():
                    raise ConfigError(f"{key}: {snap!r} is not '<run>:<step>' with run one of {sorted(RUNS)}")
                r = RUNS[run]
                if int(step) % r.checkpoint_every or not 0 < int(step) <= r.steps:
                    raise ConfigError(
                        f"{key}: step {step} of {run} is not a multiple of its checkpoint_every "
                        f"{r.checkpoint_every} within its {r.steps} steps"
                    )


def snapshot(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"{step:07d}" / "pretrained_model"


def snapshots(root: Path, folder: str, names: list[str]) -> dict[str, Path]:
    """'<run>:<step>' -> `<root>/<folder>/<run>/checkpoints/<step>/pretrained_model`, named `<run>_step<step>`."""
    out = {}
    for name in names:
        run, _, step = name.partition(":")
        out[f"{run}_step{step}"] = snapshot(root / folder / run, int(step))
    return out


def judge_dir(cfg: PushSettingConfig, root: Path) -> Path:
    return root / "judge" / Path(cfg.world_model).resolve().parent.name


def _record(name: str, out: Path, args: list[str]) -> Stage:
    return Stage(
        name,
        "record_demos.py",
        [
            "--task=push",
            f"--root={out}",
            f"--repo_id=worldloop/push_setting_{out.name}",
            "--cameras=[front]",  # the camera the world model draws and the policies read
            "--overwrite=true",
            *args,
        ],
        out / "meta" / "recording.json",
        out,
    )


def _graded(episodes: int, seed: int) -> list[str]:
    """Scripted episodes of skill drawn in [0, 1], not stopped at success, with the cubes' positions."""
    return [
        f"--episodes={episodes}",
        f"--seed={seed}",
        "--skill_range=[0.0, 1.0]",
        "--terminate_on_success=false",
        "--environment_state=true",
    ]


def _train_policy(name: str, run: PolicyRun, demos: Path, out: Path, seed: int, last_step: int) -> Stage:
    return Stage(
        name,
        "train_policy.py",
        [
            f"--config={run.config}",
            f"--dataset.root={demos}",
            f"--output_dir={out}",
            f"--train.steps={run.steps}",
            f"--train.checkpoint_every={run.checkpoint_every}",
            "--train.keep_checkpoints=0",  # every snapshot: the zoo and the judge's data read early ones
            f"--train.seed={seed}",
            *resume_args(out),
        ],
        snapshot(out, last_step) / "model.safetensors",
        out,
    )


def _last_steps(snaps: list[str]) -> dict[str, int]:
    last: dict[str, int] = {}
    for s in snaps:
        run, _, step = s.partition(":")
        last[run] = max(last.get(run, 0), int(step))
    return last


def stages(cfg: PushSettingConfig, root: Path) -> list[Stage]:
    data = root / "data"
    demos, replays = data / "push_expert", data / "push_replays"
    scripted, judge_data = data / "push_judge_scripted", data / "push_judge_mix"
    judge_snaps = snapshots(root, "judge_policies", cfg.judge_policies)
    judge_last, zoo_last = _last_steps(cfg.judge_policies), _last_steps(cfg.zoo)
    judge = judge_dir(cfg, root)
    return [
        _record(
            "record expert demos",
            demos,
            [f"--episodes={cfg.expert_episodes}", f"--seed={cfg.expert_seed}", "--skill=1.0"],
        ),
        _record("record held-out replays", replays, _graded(cfg.replay_episodes, cfg.replay_seed)),
        _record(
            "record judge scripted data",
            scripted,
            _graded(cfg.judge_scripted_episodes, cfg.judge_scripted_seed),
        ),
        *(
            _train_policy(
                f"train judge policy {name}",
                RUNS[name],
                demos,
                root / "judge_policies" / name,
                1,
                judge_last[name],
            )
            for name in sorted(judge_last)
        ),
        _record(
            "record judge policies' episodes",
            judge_data,
            [
                f"--episodes={cfg.judge_policy_episodes}",
                f"--seed={cfg.judge_policy_seed}",
                f"--policies=[{','.join(str(p) for p in judge_snaps.values())}]",
                f"--include=[{scripted}]",
                "--terminate_on_success=false",
                "--environment_state=true",
            ],
        ),
        Stage(
            "fit the drawn-frame judge",
            "train_world_model.py",
            [
                "--config=configs/world_model/tiny.yaml",
                f"--dataset.root={judge_data}",
                f"--init_from={cfg.world_model}",
                "--heads_only=true",
                "--eval.max_windows=0",
                f"--train.steps={cfg.judge_steps}",
                "--train.batch_size=32",
                "--train.checkpoint_every=1000",
                f"--output_dir={judge}",
                *resume_args(judge),
            ],
            judge / "pretrained_model" / "model.safetensors",
            judge / "pretrained_model",
        ),
        *(
            _train_policy(
                f"train zoo policy {name}", RUNS[name], demos, root / "zoo_runs" / name, 0, zoo_last[name]
            )
            for name in sorted(zoo_last)
        ),
    ]


def assemble_zoo(cfg: PushSettingConfig, root: Path) -> Path:
    """Copy the zoo's snapshots to `<root>/zoo/<run>_step<step>` (the names the ranking reports)."""
    zoo = root / "zoo"
    for name, src in snapshots(root, "zoo_runs", cfg.zoo).items():
        if not (src / "model.safetensors").is_file():
            raise ConfigError(f"zoo: {src} is missing; its training stage did not finish")
        dst = zoo / name
        if not dst.is_dir():
            shutil.copytree(src, dst.with_suffix(".tmp"), dirs_exist_ok=True)
            os.replace(dst.with_suffix(".tmp"), dst)
    return zoo


def commands(cfg: PushSettingConfig, root: Path) -> dict[str, str]:
    """The benchmark commands that measure the setting (issue 25's push figures)."""
    judge = judge_dir(cfg, root) / "pretrained_model"
    tag = judge.parent.name
    zoo = root / "zoo"
    rl = (
        f"python benchmarks/rl_in_imagination.py --policy={zoo}/flow_4k_step4000 --world_model={judge} "
        "--finetune.algorithm.type=nft --finetune.algorithm.lr=1e-4 --finetune.algorithm.starts_per_iteration=8 "
        "--finetune.eval.sim.task=push --finetune.eval.every=15 --finetune.eval.keep=last --iterations=15 "
        "--final_episodes=100 --threads=1 '--seeds=[0,1,2]'"
    )
    return {
        "replays": f"python benchmarks/imagination_eval.py --world_model={judge} "
        f"--replay_dataset={root / 'data' / 'push_replays'} --replay_split=all "
        f"--replay_max_episodes={cfg.replay_episodes} --horizon=49 --batch_envs=20 --threads=2 "
        f"--name=imagination_replay_push_{tag}",
        "real_frames": f"python benchmarks/success_head.py --world_model={judge} "
        f"--dataset.root={root / 'data' / 'push_judge_mix'} --episodes=120 --threads=2 "
        f"--name=success_head_push_judge_{tag}",
        "ranking": f"python benchmarks/imagination_eval.py --world_model={judge} --zoo={zoo} --task=push "
        "--episodes=50 --horizon=50 --threads=2 --batch_envs=10 '--observe=[drawn,first_frame,sim]' "
        f"--output_dir={root / 'ranking' / tag} --name=imagination_eval_push_{tag}",
        **{
            f"rl_{obs}": f"{rl} --observe={obs} --output_dir={root / 'rl' / f'{tag}_{obs}'} "
            f"--result_name=rl_in_imagination_push_{tag}_{obs}"
            for obs in ("drawn", "first_frame")
        },
    }


def main() -> None:
    cfg, root, records = build_setting(PushSettingConfig, stages)
    zoo = assemble_zoo(cfg, root)
    setting = {
        "world_model": cfg.world_model,
        "judge": str(judge_dir(cfg, root) / "pretrained_model"),
        "zoo": str(zoo),
        "replays": str(root / "data" / "push_replays"),
        "commands": commands(cfg, root),
    }
    save_json(setting, root / "setting.json")
    stage_rows = [{"stage": r.name, "status": r.status, "seconds": round(r.seconds)} for r in records]
    print_table(stage_rows, "stages")
    summary = write_run_record(
        root / "summary.json",
        "push_setting",
        {"config": asdict(cfg), "stages": stage_rows, "setting": setting},
    )
    print(f"wrote {root / 'setting.json'} and {summary}; measure it with:")
    for name, command in setting["commands"].items():
        print(f"  # {name}\n  {command}")


if __name__ == "__main__":
    main()
