"""The quickstart loop: every stage of worldloop, one after the other, on the tiny configs.

record expert demos -> train the world model -> (post-train it) -> train the VLA by BC -> evaluate in sim
and in imagination -> RL fine-tune in imagination -> evaluate again in sim -> (deploy on the sim robot)

Each stage runs the root script a user would run (so the loop exercises the real CLIs), skips itself when
its output already exists (and says so), and ends with a line of what it produced. A stage whose script is
not in this checkout is reported as "not available" rather than faked. The run ends with
`<run_dir>/report.html`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

from worldloop.common.checkpoint import save_json
from worldloop.pipelines.report import Media, StageRecord, write_report
from worldloop.world_model.recipe import (
    SELF_ROLLOUT_PHASE_ARGS,
    SELF_ROLLOUT_STEPS,
    TEACHER_FORCING_PHASE_ARGS,
)

REPO = Path(__file__).resolve().parent.parent


@dataclass
class QuickstartConfig:
    run: str = "tiny"  # outputs/<run>/
    output_root: str = "outputs"
    task: str = "reach"  # reach | push
    # Scripted episodes of mixed skill, not stopped at success: the world model learns from failures and
    # from what success looks like; BC trains on the episodes that succeeded.
    demo_episodes: int = 300
    demo_skill_range: list[float] = field(default_factory=lambda: [0.0, 1.0])
    demo_steps: int = 40
    world_model_steps: int = 6400
    # Then from those weights, training on its own rollouts (the self-rollout loss): on push it lifted SSIM@30
    # from 0.727 to 0.794, above copy-last at every horizon (docs/experiments.md, 2026-11-25); the recipe's
    # steps and overrides are world_model/recipe.py's. 0 skips it.
    world_model_self_rollout_steps: int = SELF_ROLLOUT_STEPS
    posttrain_steps: int = 20  # per post-training stage; a few seconds a step on 2 CPU cores
    heads_steps: int = 1500  # outcome heads fitted again on the post-trained model's own rollouts
    policy_steps: int = 2000  # the tiny FlowVLA recipe: 100/100 on reach with 360 skill-1.0 demos
    eval_episodes: int = 50
    finetune_iterations: int = 20
    finetune_group_size: int = 8  # GRPO rollouts per imagined start
    finetune_starts: int = 4  # imagined starts per GRPO iteration
    deploy_seconds: float = 10.0
    fast: bool = False  # a first look in <= 10 minutes: fewer demos, steps and episodes
    force: bool = False  # re-run stages whose outputs exist

    def apply_fast(self) -> None:
        if self.fast:
            self.demo_episodes = min(self.demo_episodes, 40)
            self.world_model_steps = min(self.world_model_steps, 150)
            self.world_model_self_rollout_steps = min(self.world_model_self_rollout_steps, 20)
            self.posttrain_steps = min(self.posttrain_steps, 5)
            self.heads_steps = min(self.heads_steps, 100)
            self.policy_steps = min(self.policy_steps, 300)
            self.eval_episodes = min(self.eval_episodes, 10)
            self.finetune_iterations = min(self.finetune_iterations, 2)
            self.finetune_group_size = min(self.finetune_group_size, 4)
            self.finetune_starts = min(self.finetune_starts, 2)
            self.deploy_seconds = min(self.deploy_seconds, 3.0)


@dataclass
class Stage:
    name: str
    script: str  # root script
    args: list[str]
    done_marker: Path  # exists once the stage has produced its output (see `is_done`)
    produced: Path | None  # what a later stage or a user reads; None for a check that writes nothing
    metrics: Callable[[], dict] = dict
    launcher: list[str] = field(default_factory=lambda: [sys.executable])
    # The stages whose outputs it reads, by name: with `run_stages(jobs=N)` it starts once they are done, beside
    # up to N - 1 others. None: every stage listed before it.
    needs: tuple[str, ...] | None = None
    # Files it reads that a later run may remake (a model a benchmark scores): the stage is not done where one
    # is newer than its marker, so a result never outlives what it measured.
    inputs: tuple[Path, ...] = ()


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _read_json_list(path: Path) -> list:
    data = json.loads(path.read_text()) if path.is_file() else []
    return data if isinstance(data, list) else []


def _pick(d: dict, *keys: str) -> dict:
    return {k: d[k] for k in keys if k in d}


def stages_for(cfg: QuickstartConfig, run_dir: Path) -> list[Stage]:
    data = run_dir / "data" / f"{cfg.task}_demos"
    wm = run_dir / "world_model"
    wm_sr = run_dir / "world_model_self_rollout"
    wm_trained = wm_sr if cfg.world_model_self_rollout_steps else wm
    wm_post = run_dir / "world_model_posttrained"
    pol = run_dir / "policy"
    ft = run_dir / "policy_finetuned"
    eval_bc = run_dir / "eval" / "bc_sim"
    eval_bc_imag = run_dir / "eval" / "bc_imagination"
    eval_ft = run_dir / "eval" / "finetuned_sim"
    wm_final = run_dir / "world_model_final"
    wm_ckpt = wm_final / "pretrained_model"
    sim_eval = ["--backend=sim", f"--episodes={cfg.eval_episodes}", f"--sim.task={cfg.task}"]
    return [
        Stage(
            "record demos",
            "record_demos.py",
            [
                "--config=configs/record/tiny.yaml",
                f"--root={data}",
                f"--repo_id=worldloop/{cfg.run}_{cfg.task}",
                f"--task={cfg.task}",
                f"--episodes={cfg.demo_episodes}",
                f"--skill_range={json.dumps(cfg.demo_skill_range)}",
                f"--max_steps={cfg.demo_steps}",
                "--cameras=[front]",  # the camera the world model draws and the policy reads
                "--terminate_on_success=false",
                "--overwrite=true",
            ],
            data / "meta" / "recording.json",
            data,
            lambda: _pick(_read_json(data / "meta" / "info.json"), "total_episodes", "total_frames", "fps"),
        ),
        Stage(
            "train world model",
            "train_world_model.py",
            [
                "--config=configs/world_model/tiny.yaml",
                f"--dataset.root={data}",
                f"--output_dir={wm}",
                f"--train.steps={cfg.world_model_steps}",
                *TEACHER_FORCING_PHASE_ARGS,
            ],
            wm / "pretrained_model" / "model.safetensors",
            wm / "pretrained_model",
            lambda: _latest_eval(wm),
        ),
        *(
            [
                Stage(
                    "train world model on its own rollouts",
                    "train_world_model.py",
                    [
                        "--config=configs/world_model/tiny.yaml",
                        f"--dataset.root={data}",
                        f"--init_from={wm / 'pretrained_model'}",
                        f"--output_dir={wm_sr}",
                        f"--train.steps={cfg.world_model_self_rollout_steps}",
                        *SELF_ROLLOUT_PHASE_ARGS,
                    ],
                    wm_sr / "pretrained_model" / "model.safetensors",
                    wm_sr / "pretrained_model",
                    lambda: _latest_eval(wm_sr),
                )
            ]
            if cfg.world_model_self_rollout_steps
            else []
        ),
        Stage(
            "post-train world model",
            "posttrain_world_model.py",
            [
                "--config=configs/posttrain/tiny.yaml",
                f"--world_model.path={wm_trained / 'pretrained_model'}",
                f"--dataset.root={data}",
                f"--output_dir={wm_post}",
                f"--train.steps={cfg.posttrain_steps}",
                f"--train.checkpoint_every={cfg.posttrain_steps}",
            ],
            wm_post / "pretrained_model" / "model.safetensors",
            wm_post / "pretrained_model",
        ),
        Stage(
            # The heads judge generated frames in imagination: fit them on the final model's rollouts.
            "fit outcome heads on rollouts",
            "train_world_model.py",
            [
                "--config=configs/world_model/tiny.yaml",
                f"--dataset.root={data}",
                f"--init_from={wm_post / 'pretrained_model'}",
                "--heads_only=true",
                f"--output_dir={wm_final}",
                f"--train.steps={cfg.heads_steps}",
                "--train.batch_size=32",
            ],
            wm_ckpt / "model.safetensors",
            wm_ckpt,
            lambda: _latest_eval(wm_final, ("success_accuracy", "reward_mae")),
        ),
        Stage(
            "train policy (BC)",
            "train_policy.py",
            [
                "--config=configs/policy/tiny.yaml",
                f"--dataset.root={data}",
                f"--output_dir={pol}",
                f"--train.steps={cfg.policy_steps}",
                f"--eval.env.task={cfg.task}",
                "--successful_episodes_only=true",
                # The policy reads only the camera the world model draws, so it can run in imagination.
                "--policy.flow_vla.cameras=[front]",
            ],
            pol / "pretrained_model" / "model.safetensors",
            pol / "pretrained_model",
        ),
        Stage(
            "evaluate BC policy in sim",
            "evaluate_policy.py",
            [*sim_eval, f"--policy.path={pol / 'pretrained_model'}", f"--output_dir={eval_bc}"],
            eval_bc / "summary.json",
            eval_bc,
            lambda: _eval_metrics(eval_bc),
        ),
        Stage(
            "evaluate BC policy in imagination",
            "evaluate_policy.py",
            [
                "--backend=imagination",
                "--compare_sim=true",
                f"--sim.task={cfg.task}",
                f"--episodes={cfg.eval_episodes}",
                f"--policy.path={pol / 'pretrained_model'}",
                f"--imagination.world_model={wm_ckpt}",
                f"--output_dir={eval_bc_imag}",
            ],
            eval_bc_imag / "ranking.json",
            eval_bc_imag,
            lambda: _ranking_metrics(eval_bc_imag),
        ),
        Stage(
            "RL fine-tune policy in imagination",
            "finetune_policy.py",
            [
                "--config=configs/finetune/tiny.yaml",
                f"--policy.path={pol / 'pretrained_model'}",
                f"--world_model={wm_ckpt}",
                f"--output_dir={ft}",
                f"--iterations={cfg.finetune_iterations}",
                f"--algorithm.group_size={cfg.finetune_group_size}",
                f"--algorithm.starts_per_iteration={cfg.finetune_starts}",
                f"--eval.every={cfg.finetune_iterations}",
                f"--eval.episodes={cfg.eval_episodes}",
                f"--eval.sim.task={cfg.task}",
            ],
            ft / "pretrained_model" / "model.safetensors",
            ft / "pretrained_model",
        ),
        Stage(
            "evaluate fine-tuned policy in sim",
            "evaluate_policy.py",
            [*sim_eval, f"--policy.path={ft / 'pretrained_model'}", f"--output_dir={eval_ft}"],
            eval_ft / "summary.json",
            eval_ft,
            lambda: _eval_metrics(eval_ft),
        ),
        Stage(
            "deploy on the sim robot",
            "deploy.py",
            [
                "--config=configs/deploy/tiny.yaml",
                f"--robot.task={cfg.task}",
                f"--policy_path={ft / 'pretrained_model'}",
                f"--episode_time_s={cfg.deploy_seconds}",
                f"--record.root={run_dir / 'deploy'}",
            ],
            run_dir / "deploy" / "meta" / "info.json",
            run_dir / "deploy",
            lambda: _pick(
                _read_json(run_dir / "deploy" / "meta" / "info.json"), "total_episodes", "total_frames"
            ),
        ),
    ]


def _eval_metrics(directory: Path) -> dict:
    s = _read_json(directory / "summary.json")
    out = _pick(s, "success_rate", "mean_progress", "episodes")
    if "success_ci95" in s:
        out["success_ci95"] = "{:.2f}-{:.2f}".format(*s["success_ci95"])
    return out


def _ranking_metrics(directory: Path) -> dict:
    """Imagined vs simulated success of the (first) policy evaluated by `--backend imagination`."""
    policies = _read_json(directory / "ranking.json").get("policies", {})
    if not policies:
        return {}
    first = next(iter(policies.values()))
    out = {}
    for backend in ("imagination", "sim"):
        if backend in first:
            out[f"{backend} success"] = first[backend]["success_rate"]
            out[f"{backend} success 95% CI"] = "{:.2f}-{:.2f}".format(*first[backend]["success_ci95"])
            out[f"{backend} progress"] = first[backend]["mean_progress"]
    if first.get("disagreement"):  # the two intervals do not overlap (report.py shows it on top)
        out["disagreement"] = first["disagreement"]
    return out


def _latest_eval(train_dir: Path, names=("ssim", "ssim_copy_last", "psnr", "psnr_copy_last")) -> dict:
    """Curves `names` at horizons 1, 10 and 30 from the world-model trainer's last evaluation (fidelity by
    default)."""
    evals = sorted((train_dir / "eval").glob("*/metrics.json"))
    curves = _read_json(evals[-1]) if evals else {}
    out = {}
    for name in names:
        values = curves.get(name, [])
        for h in (1, 10, 30):
            if len(values) >= h:
                out[f"{name}@{h}"] = values[h - 1]
    return out


def resume_args(output_dir: Path) -> list[str]:
    """`--resume=true` where a training run in `output_dir` left a checkpoint: a stage run again continues it."""
    return ["--resume=true"] if (output_dir / "checkpoints" / "last").exists() else []


def is_done(stage: Stage) -> bool:
    """The marker exists, is newer than each of the stage's `inputs` that exists and, where it is a JSON record
    with a `complete` flag, says complete."""
    if not stage.done_marker.is_file():
        return False
    made = stage.done_marker.stat().st_mtime
    if any(p.is_file() and p.stat().st_mtime > made for p in stage.inputs):
        return False
    if stage.done_marker.suffix == ".json":
        record = _read_json(stage.done_marker)
        return bool(record.get("complete", True)) if isinstance(record, dict) else True
    return True


def run_stage(stage: Stage, force: bool, log_dir: Path, echo: bool = True) -> StageRecord:
    """Run `stage` (or skip it where its output exists), its output kept in `<log_dir>/<name>.log` and, with
    `echo`, shown as it comes (off where stages run side by side)."""
    script = REPO / stage.script
    if not script.is_file() or script.stat().st_size == 0:
        print(f"[{stage.name}] not available in this checkout ({stage.script} is missing)", flush=True)
        return StageRecord(stage.name, "not available", 0.0)
    if is_done(stage) and not force:
        print(f"[{stage.name}] skipped: {stage.produced} already exists (--force=true to redo)", flush=True)
        return StageRecord(stage.name, "skipped", 0.0, str(stage.produced), stage.metrics())
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / (stage.name.replace(" ", "_").replace("(", "").replace(")", "") + ".log")
    cmd = [*stage.launcher, str(script), *stage.args]
    print(f"[{stage.name}] {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        # The child's own progress bars go to the terminal; everything is also kept in the log.
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if echo:
                sys.stdout.write(line)
            f.write(line)
        rc = proc.wait()
    seconds = time.perf_counter() - t0
    if rc != 0:
        print(f"[{stage.name}] FAILED (exit {rc}) after {seconds:.0f}s; log: {log}", flush=True)
        return StageRecord(stage.name, "failed", seconds, str(log))
    produced = f": produced {stage.produced}" if stage.produced else ""
    print(f"[{stage.name}] done in {seconds:.0f}s{produced}", flush=True)
    return StageRecord(stage.name, "ran", seconds, str(stage.produced or ""), stage.metrics())


def run_stages(stages: list[Stage], force: bool, run_dir: Path, jobs: int = 1) -> list[StageRecord]:
    """Run the stages (logs under run_dir/logs), in order, or with `jobs` > 1 up to that many at a time, each as
    soon as the stages it needs are done (the earliest listed first); no stage starts after a failure. The
    records, in the stages' order, go to run_dir/stages.json. A skipped stage keeps the time it took when it
    ran, so a resumed run's record stays complete."""
    earlier = {
        r["name"]: r
        for r in _read_json_list(run_dir / "stages.json")
        if r.get("status") in ("ran", "done earlier")
    }
    ran: dict[str, StageRecord] = {}
    if jobs == 1:
        for stage in stages:
            ran[stage.name] = run_stage(stage, force, run_dir / "logs")
            if ran[stage.name].status == "failed":
                break
    else:
        _run_side_by_side(stages, force, run_dir / "logs", jobs, ran)
    records = []
    for stage in stages:
        if (record := ran.get(stage.name)) is None:
            continue
        if record.status == "skipped" and stage.name in earlier:
            record.status, record.seconds = "done earlier", earlier[stage.name]["seconds"]
        records.append(record)
    save_json([vars(r) for r in records], run_dir / "stages.json")
    return records


def _run_side_by_side(
    stages: list[Stage], force: bool, log_dir: Path, jobs: int, ran: dict[str, StageRecord]
) -> None:
    """`run_stages` with jobs > 1: fills `ran` as stages end. A stage whose needs failed never starts."""
    names = [s.name for s in stages]
    needs = {s.name: set(names[:i] if s.needs is None else s.needs) for i, s in enumerate(stages)}
    if unknown := {n for s in stages for n in needs[s.name] if n not in names}:
        raise ValueError(f"stages need {sorted(unknown)}, which are not among them")
    pending, running = list(stages), {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        while pending or running:
            failed = any(r.status == "failed" for r in ran.values())
            for stage in [] if failed else list(pending):
                if len(running) < jobs and all(n in ran for n in needs[stage.name]):
                    pending.remove(stage)
                    running[pool.submit(run_stage, stage, force, log_dir, False)] = stage
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                ran[running.pop(future).name] = future.result()


def build_setting(config_class, stages_of: Callable) -> tuple:
    """A benchmark-setting builder's start (pipelines.rl_setting, .push_setting): its config from the command
    line, validated; its stages run under `root` (resuming: done stages are skipped). Returns (cfg, root,
    records); exits naming the failed stage and its log."""
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from worldloop.common.config import parse_cli

    cfg = parse_cli(config_class)
    cfg.validate()
    root = Path(cfg.root) if Path(cfg.root).is_absolute() else REPO / cfg.root
    # A config with a `jobs` field runs that many stages at a time, each once the stages it needs are done.
    records = run_stages(stages_of(cfg, root), cfg.force, root, getattr(cfg, "jobs", 1))
    if failed := [r for r in records if r.status == "failed"]:
        raise SystemExit("; ".join(f"{r.name} failed; log: {r.produced}" for r in failed))
    return cfg, root, records


def _mp4_to_gif(src: Path, dst: Path, max_frames: int = 60) -> Path:
    import imageio.v3 as iio

    frames = iio.imread(src, index=None)[:max_frames]
    dst.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(dst, frames, duration=100, loop=0)
    return dst


def collect_media(run_dir: Path) -> tuple[list[Media], list[Media]]:
    """Figures (PNG) and videos the stages wrote; MP4 videos are converted to GIF for the page."""
    figures = [
        Media(p.stem.replace("_", " "), p, str(p.parent.relative_to(run_dir)))
        for p in sorted(run_dir.rglob("*.png"))
    ]
    wanted = [
        "world_model/eval/*/rollout.mp4",
        "eval/*/*/videos/sim_vs_imagined_*.mp4",
        "eval/*_sim/videos/*.mp4",
    ]
    videos = []
    for pattern in wanted:
        for src in sorted(run_dir.glob(pattern))[:3]:
            rel = src.relative_to(run_dir)
            gif = run_dir / "report_media" / (str(rel.with_suffix("")).replace("/", "__") + ".gif")
            if not gif.is_file():
                _mp4_to_gif(src, gif)
            videos.append(Media(src.stem.replace("_", " "), gif, str(rel.parent)))
    return figures[:24], videos[:12]


def run_quickstart(cfg: QuickstartConfig) -> Path:
    cfg.apply_fast()
    run_dir = Path(cfg.output_root) / cfg.run
    if not run_dir.is_absolute():
        run_dir = REPO / run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    env_defaults = {"MUJOCO_GL": "egl", "HF_HUB_OFFLINE": "1"}
    for k, v in env_defaults.items():
        os.environ.setdefault(k, v)
    records = run_stages(stages_for(cfg, run_dir), cfg.force, run_dir)
    total = sum(r.seconds for r in records)
    figures, videos = collect_media(run_dir)
    report = write_report(
        run_dir / "report.html",
        f"worldloop quickstart: {cfg.run} ({'fast' if cfg.fast else 'full'}), {total / 60:.1f} min",
        records,
        figures,
        videos,
        {"config": vars(cfg)},
    )
    print(f"quickstart: {total / 60:.1f} min of stage time; report: {report}")
    if any(r.status == "failed" for r in records):
        raise SystemExit(1)
    return report
