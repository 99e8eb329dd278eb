"""RL fine-tuning of a BC policy in imagination, with the simulator used only to evaluate.

    python finetune_policy.py --config configs/finetune/tiny.yaml --policy.path=... --world_model=...
    python finetune_policy.py ... --algorithm.type=ppo        # PPO with a value head instead of GRPO
    python finetune_policy.py ... --algorithm.type=nft        # likelihood-free DiffusionNFT
    python finetune_policy.py ... --algorithm.type=steer      # PPO on the initial noise (latent steering)

Training episodes start from a pool of real first observations (simulator or LeRobot env resets, rendered
and never stepped, or dataset episodes) and run only in the world model, optimised by the algorithm the config's
`algorithm` choice names (`policy_rl.configuration.AlgorithmConfig`): GRPO (`policy_rl/grpo/`, the default)
or PPO with a value head (`policy_rl/ppo/`), which share the rollout collection and the clipped update with
a KL to the BC policy (`policy_rl.flow_policy_gradient`), or DiffusionNFT (`policy_rl/nft/`: the same
collection, a reward-weighted flow-matching update), or latent steering (`policy_rl/steer/`: PPO on a head that
picks the initial noise of the frozen BC policy's sampler). Every `eval.every` iterations the policy is evaluated
in imagination and in the simulator from the same held-out starts (`eval.backend`: the MuJoCo sim, or
one of LeRobot's gym envs such as gym-pusht for a world model of another robot); imagined and simulated success are
logged side by side. When their difference moves by more than `eval.max_gap` from the BC policy's (the
world model's own bias), the policy is exploiting the world model: training stops and the policy rolls
back to the last evaluated weights within the margin.

Simulator physics steps are counted around every training iteration (`rl_finetune.sim_steps`); the run
fails if training used any, and the summary reports the evaluation's sim steps separately. The one exception
is asked for by name: `--rollouts=sim` trains on the simulator's own episodes (`policy_rl.sim_rollouts`), the
diagnostic that measures what the RL recipe gains with a perfect world model and judge; its summary then
reports the training's sim steps.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from worldloop.common.checkpoint import (
    atomic_directory,
    load_json,
    load_model_weights,
    load_torch,
    save_json,
    save_torch,
)
from worldloop.rl_finetune.closed_loop_config import LoopConfig
from worldloop.rl_finetune.imagination.evaluation import check_cameras, evaluate_in_imagination
from worldloop.rl_finetune.imagination.initial_states import dataset_starts, lerobot_env_starts, sim_starts
from worldloop.rl_finetune.imagination.ranking import disagreement
from worldloop.rl_finetune.policy_rl.configuration import AlgorithmConfig
from worldloop.rl_finetune.policy_rl.flow_policy_gradient import FlowPolicyTrainer
from worldloop.rl_finetune.policy_rl.grpo.configuration_grpo import GRPOConfig
from worldloop.rl_finetune.policy_rl.grpo.grpo import GRPOTrainer
from worldloop.rl_finetune.policy_rl.nft.configuration_nft import PolicyNFTConfig
from worldloop.rl_finetune.policy_rl.nft.nft import PolicyNFTTrainer
from worldloop.rl_finetune.policy_rl.ppo.configuration_ppo import PPOConfig
from worldloop.rl_finetune.policy_rl.ppo.ppo import PPOTrainer
from worldloop.rl_finetune.policy_rl.sim_rollouts import SimRolloutEnv
from worldloop.rl_finetune.policy_rl.steer.configuration_steer import SteerConfig
from worldloop.rl_finetune.policy_rl.steer.steer import SteerTrainer
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.vla.factory import load_policy
from worldloop.vla.lerobot_env_evaluation import LeRobotEnvEvalConfig, evaluate_in_lerobot_env
from worldloop.vla.sim_evaluation import SimEvalConfig, evaluate_in_sim
from worldloop.world_model.checkpoint_inputs import embodiment_of
from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import InitialStates, WorldModelEnv, WorldModelEnvConfig


@dataclass
class PolicyPath:
    path: str = ""  # the BC policy to start from (a pretrained policy directory)


@dataclass
class StartsConfig:
    # sim (MuJoCo reset frames, physics never stepped) | lerobot_env (the reset frames of eval.env) |
    # dataset (first frames of episodes)
    source: str = "sim"
    count: int = 32  # distinct initial states in the training pool
    seed: int = 0  # sim, lerobot_env: reset seeds seed..seed+count-1 (keep clear of eval.seed)
    dataset_root: str = ""  # dataset: a LeRobotDataset v3 directory; its first `count` episodes
    # dataset, lerobot_env: frames of another size than the world model's: crop | stretch ("" -> as the
    # world model's training data was resized)
    resize: str = ""


@dataclass
class FinetuneEvalConfig:
    every: int = 10  # iterations between evaluations (and at the start and the end)
    episodes: int = 20  # held-out starts, evaluated in imagination and in the simulator
    seed: int = 100_000  # sim (or env) seeds of the held-out starts (as evaluate_policy.py)
    # Where the held-out starts are also run for real: sim (the MuJoCo tabletop, `sim`) or lerobot_env (one
    # of LeRobot's gym envs, `env`, e.g. gym-pusht). The summary's sim_* figures are that backend's.
    backend: str = "sim"
    batch_envs: int = 10
    # Roll back and stop when imagined - sim success has moved by more than this since the BC policy's
    # evaluation (the BC policy's own gap is the world model's bias, present before any RL).
    max_gap: float = 0.25
    # Which evaluated weights the run ends with: "last", or "best_imagined": those of the evaluation with the
    # highest imagined success (the earliest of equals; the BC policy's counts). Chosen in imagination alone:
    # the sim success beside it is reported, never read. Past a peak the policy can keep drifting from BC.
    keep: str = "last"
    sim: SimEvalConfig = field(default_factory=lambda: SimEvalConfig(videos=0))
    # backend lerobot_env: max_steps 0 -> the imagination horizon (env.horizon); the held-out starts are the
    # env's resets, resized to the world model's frames as starts.resize says.
    env: LeRobotEnvEvalConfig = field(default_factory=lambda: LeRobotEnvEvalConfig(videos=0))


EVAL_BACKENDS = ("sim", "lerobot_env")
ROLLOUTS = ("imagination", "sim")


@dataclass
class FinetunePolicyConfig:
    policy: PolicyPath = field(default_factory=PolicyPath)
    world_model: str = ""  # a pretrained world-model directory
    # The robot the world model acts for: "" -> the one its checkpoint stores; a built-in name or YAML file
    # must agree with it (or names it for an older checkpoint). eval.backend=sim needs the tabletop arm.
    embodiment: str = ""
    output_dir: str = "outputs/finetune/tiny"
    iterations: int = 30
    # Stop, with an evaluation, before this process has used this many CPU-minutes (every thread, across
    # resumes): when one more iteration and the closing evaluation would not fit. 0: no budget.
    cpu_budget_minutes: float = 0.0
    seed: int = 0
    device: str = "cpu"
    resume: bool = (
        False  # continue from the last checkpoint in output_dir (written at each passed evaluation)
    )
    keep_checkpoints: int = 2
    env: WorldModelEnvConfig = field(default_factory=WorldModelEnvConfig)
    # --algorithm.type=grpo (group-relative baseline) | ppo (value head + GAE) | nft (likelihood-free), then
    # that algorithm's fields: --algorithm.lr=1e-4. See rl_finetune/policy_rl/.
    algorithm: AlgorithmConfig = field(default_factory=GRPOConfig)
    starts: StartsConfig = field(default_factory=StartsConfig)
    eval: FinetuneEvalConfig = field(default_factory=FinetuneEvalConfig)
    # The policy the KL trust region anchors to; "" -> the policy being fine-tuned, as loaded.
    reference_policy: str = ""
    loop: LoopConfig = field(default_factory=LoopConfig)  # --loop.rounds=N: the closed loop (closed_loop.py)
    # Where the training rollouts happen: "imagination" (the world model and its judge; never the simulator),
    # or "sim": the simulator's own episodes from the same starts, scored by its own success and progress
    # (policy_rl/sim_rollouts.py). "sim" measures the RL recipe's ceiling with a perfect world model and judge;
    # it steps the physics for training, and its summary says how often. The eval.max_gap guard (against
    # exploiting the world model) does not apply there: imagined success is still evaluated and reported.
    rollouts: str = "imagination"

    def validate(self) -> None:
        """Refuses a config that cannot run, and fills the one default that depends on another field
        (`eval.env.max_steps` 0 -> `env.horizon` for the lerobot_env backend), so that a config is compared
        (`finished_run`) and recorded (`summary.json`) as it runs."""
        if not self.policy.path:
            raise ValueError("--policy.path is required: the BC policy directory to fine-tune")
        if not self.world_model:
            raise ValueError("--world_model is required: a directory written by train_world_model.py")
        if self.eval.backend not in EVAL_BACKENDS:
            raise ValueError(f"eval.backend={self.eval.backend!r}; expected one of {EVAL_BACKENDS}")
        if self.starts.source not in ("sim", "dataset", "lerobot_env"):
            raise ValueError(
                f"starts.source={self.starts.source!r}; expected 'sim', 'lerobot_env' or 'dataset'"
            )
        if self.starts.source == "dataset" and not self.starts.dataset_root:
            raise ValueError("starts.source=dataset needs starts.dataset_root")
        if self.iterations < 1 or self.eval.every < 1 or self.eval.episodes < 1:
            raise ValueError("iterations, eval.every and eval.episodes must be >= 1")
        if self.eval.keep not in ("last", "best_imagined"):
            raise ValueError(f"eval.keep={self.eval.keep!r}; expected 'last' or 'best_imagined'")
        if self.cpu_budget_minutes < 0:
            raise ValueError(f"cpu_budget_minutes={self.cpu_budget_minutes}; expected >= 0 (0: no budget)")
        if type(self.algorithm) not in TRAINERS:
            raise ValueError(
                f"algorithm: {type(self.algorithm).__name__} has no trainer; expected one of "
                f"{sorted(c.__name__ for c in TRAINERS)}"
            )
        if self.rollouts not in ROLLOUTS:
            raise ValueError(f"rollouts={self.rollouts!r}; expected one of {ROLLOUTS}")
        if self.rollouts == "sim":
            if self.starts.source != "sim" or self.eval.backend != "sim" or self.loop.rounds:
                raise ValueError(
                    "rollouts=sim runs the MuJoCo tabletop: it needs starts.source=sim, eval.backend=sim and "
                    "no closed loop (loop.rounds=0)"
                )
            if getattr(self.algorithm, "hindsight", False):
                raise ValueError(
                    "rollouts=sim has no judge to relabel episodes with: set algorithm.hindsight=false"
                )
        self.env.validate()
        self.algorithm.validate()
        self.loop.validate()
        if self.eval.backend == "lerobot_env":
            self.eval.env.max_steps = self.eval.env.max_steps or self.env.horizon

    @property
    def episodes_per_iteration(self) -> int:
        return self.algorithm.episodes_per_iteration


# The trainer of each algorithm choice, keyed by its config class (registered as `--algorithm.type`).
TRAINERS: dict[type[AlgorithmConfig], type[FlowPolicyTrainer]] = {
    GRPOConfig: GRPOTrainer,
    PPOConfig: PPOTrainer,
    PolicyNFTConfig: PolicyNFTTrainer,
    SteerConfig: SteerTrainer,
}


def make_trainer(cfg: FinetunePolicyConfig, policy, env: WorldModelEnv) -> FlowPolicyTrainer:
    """The trainer of `cfg.algorithm`'s type, its BC reference loaded from `cfg.reference_policy` if set."""
    trainer = TRAINERS[type(cfg.algorithm)](policy, env, cfg.algorithm, seed=cfg.seed)
    if cfg.reference_policy:
        trainer.load_reference(Path(cfg.reference_policy) / "model.safetensors")
    return trainer


SIM_HINT = "fine-tune with --eval.backend=lerobot_env and --starts.source=lerobot_env or dataset"


def training_starts(cfg: FinetunePolicyConfig, env: WorldModelEnv) -> InitialStates:
    s = cfg.starts
    if s.source == "dataset":
        return dataset_starts(env, s.dataset_root, s.count, s.resize)
    if s.seed + s.count > cfg.eval.seed and cfg.eval.seed + cfg.eval.episodes > s.seed:
        raise ValueError(
            f"training start seeds {s.seed}..{s.seed + s.count - 1} overlap the evaluation seeds "
            f"{cfg.eval.seed}..{cfg.eval.seed + cfg.eval.episodes - 1}"
        )
    if s.source == "lerobot_env":
        return lerobot_env_starts(env, cfg.eval.env, s.count, s.seed, s.resize)
    return sim_starts(env, cfg.eval.sim, s.count, s.seed, SIM_HINT)


def held_out_starts(cfg: FinetunePolicyConfig, env: WorldModelEnv) -> InitialStates:
    """The first observations of the evaluation backend's episodes with seeds eval.seed.."""
    ev = cfg.eval
    if ev.backend == "lerobot_env":
        return lerobot_env_starts(env, ev.env, ev.episodes, ev.seed, cfg.starts.resize)
    return sim_starts(env, ev.sim, ev.episodes, ev.seed, SIM_HINT)


def evaluate(policy, env: WorldModelEnv, starts: InitialStates, cfg: FinetuneEvalConfig, device: str) -> dict:
    """Imagined and simulated success from the same held-out starts (simulated: in `cfg.backend`); sim
    steps counted; `disagreement` says when the two 95% intervals do not overlap."""
    imagined, _ = evaluate_in_imagination(policy, env, starts, cfg.seed, cfg.batch_envs, progress_bar=False)
    with count_sim_steps() as counter:
        if cfg.backend == "lerobot_env":
            simulated = evaluate_in_lerobot_env(
                policy, cfg.env, cfg.episodes, cfg.seed, None, device, progress_bar=False
            )
        else:
            simulated = evaluate_in_sim(
                policy, cfg.sim, cfg.episodes, cfg.seed, None, device, progress_bar=False
            )
    return {
        "imagined_success": imagined["success_rate"],
        "imagined_success_ci95": imagined["success_ci95"],
        "imagined_progress": imagined["mean_progress"],
        "sim_success": simulated["success_rate"],
        "sim_success_ci95": simulated["success_ci95"],
        "sim_progress": simulated["mean_progress"],
        "gap": imagined["success_rate"] - simulated["success_rate"],
        "reference": cfg.backend,  # where the sim_* figures come from
        "sim_episodes": simulated["episodes"],
        "disagreement": disagreement(imagined, simulated, cfg.backend),
        "sim_steps": counter.steps,
    }


def save_checkpoint(out: Path, trainer: FlowPolicyTrainer, loop_state: dict, keep: int) -> None:
    """checkpoints/<iteration>/: the policy (pretrained layout), optimiser state, loop state (RNG, logs)."""
    with atomic_directory(out / "checkpoints" / f"{trainer.iteration:06d}") as tmp:
        trainer.policy.save_pretrained(tmp / "pretrained_model")
        save_torch(trainer.state_dict(), tmp / "trainer_state.pt")
        save_json(loop_state, tmp / "loop_state.json")
    for old in sorted((out / "checkpoints").glob("[0-9]*"))[:-keep]:
        shutil.rmtree(old)


def resume_from(out: Path, trainer: FlowPolicyTrainer) -> dict:
    """Load the last checkpoint into `trainer` (whose BC reference is already set); returns the loop state."""
    checkpoints = sorted((out / "checkpoints").glob("[0-9]*")) if (out / "checkpoints").is_dir() else []
    if not checkpoints:
        raise FileNotFoundError(f"resume=true but {out}/checkpoints holds no checkpoint")
    last = checkpoints[-1]
    load_model_weights(trainer.policy, last / "pretrained_model" / "model.safetensors")
    trainer.load_state_dict(load_torch(last / "trainer_state.pt"))
    return load_json(last / "loop_state.json")


def finetune(cfg: FinetunePolicyConfig) -> dict:
    cfg.validate()
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    policy = load_policy(cfg.policy.path, cfg.device)
    world_model = WorldModel.from_pretrained(cfg.world_model, cfg.device)
    env = WorldModelEnv(world_model, cfg.env, embodiment=embodiment_of(world_model, cfg.embodiment))
    check_cameras(policy, env)
    backend_steps = cfg.eval.env.max_steps if cfg.eval.backend == "lerobot_env" else cfg.eval.sim.max_steps
    if cfg.env.horizon != backend_steps:
        raise ValueError(
            f"env.horizon={cfg.env.horizon} differs from the {cfg.eval.backend} episodes' max_steps="
            f"{backend_steps}: imagined and simulated episodes must last as long"
        )
    pool = training_starts(cfg, env)
    held_out = held_out_starts(cfg, env)
    rollout_env = env
    if cfg.rollouts == "sim":
        frame_size = world_model.cfg.frame_size
        rollout_env = SimRolloutEnv(cfg.eval.sim, cfg.env, env.cameras, frame_size, cfg.device)
    trainer = make_trainer(cfg, policy, rollout_env)
    # A config file's `algorithm:` fields stay when the command line changes `--algorithm.type`: say what runs.
    tqdm.write(f"{cfg.algorithm.type}: " + ", ".join(f"{k}={v}" for k, v in asdict(cfg.algorithm).items()))
    rng = np.random.default_rng(cfg.seed)
    history, evaluations = [], []
    train_sim_steps = 0
    good = {k: v.clone() for k, v in policy.state_dict().items()}
    stopped, rolled_back = None, False
    # CPU time of this process (every thread): the budget figure, which other jobs on the cores do not inflate
    # as they do the wall time. None when resumed from a checkpoint that did not record it.
    t0, c0 = time.perf_counter(), time.process_time()
    if cfg.resume:
        state = resume_from(out, trainer)
        rng.bit_generator.state = state["rng"]
        history, evaluations, train_sim_steps = (
            state["history"],
            state["evaluations"],
            state["train_sim_steps"],
        )
        t0 -= state["seconds"]
        c0 = c0 - state["cpu_seconds"] if "cpu_seconds" in state else None
        good = {k: v.clone() for k, v in policy.state_dict().items()}

    cost = {"eval": 0.0, "iteration": 0.0}  # CPU seconds of the last evaluation and the last iteration

    def run_eval(iteration: int) -> dict:
        c = time.process_time()
        ev = {"iteration": iteration, **evaluate(policy, env, held_out, cfg.eval, cfg.device)}
        cost["eval"] = time.process_time() - c
        evaluations.append(ev)
        tqdm.write(
            f"iter {iteration}: imagined success {ev['imagined_success']:.2f}, {cfg.eval.backend} success "
            f"{ev['sim_success']:.2f} (gap {ev['gap']:+.2f})"
            + (f"; DISAGREEMENT: {ev['disagreement']}" if ev["disagreement"] else "")
        )
        return ev

    if not evaluations:
        run_eval(0)
    # eval.keep=best_imagined: the passed evaluation with the highest imagined success, its weights kept in
    # output_dir/best_imagined/ (a resumed run reads them back).
    best_dir = out / "best_imagined"

    def keep_best(ev: dict) -> None:
        with atomic_directory(best_dir) as tmp:
            policy.save_pretrained(tmp / "pretrained_model")
            save_json(ev, tmp / "evaluation.json")

    if cfg.eval.keep == "best_imagined" and not (cfg.resume and best_dir.is_dir()):
        keep_best(evaluations[0])
    best = load_json(best_dir / "evaluation.json") if cfg.eval.keep == "best_imagined" else None
    metrics = open(out / "metrics.jsonl", "w")
    metrics.writelines(json.dumps(h) + "\n" for h in history)
    desc = f"{trainer.algorithm} in " + ("imagination" if cfg.rollouts == "imagination" else "the simulator")
    starts_per_iteration = cfg.algorithm.starts_per_iteration
    for it in tqdm(range(trainer.iteration + 1, cfg.iterations + 1), desc=desc):
        index = rng.choice(pool.batch_size, size=starts_per_iteration, replace=False).tolist()
        c = time.process_time()
        with count_sim_steps() as counter:
            logs = trainer.step(pool.select(index))
        cost["iteration"] = time.process_time() - c
        train_sim_steps += counter.steps
        logs = {"iteration": it, "seconds": time.perf_counter() - t0, **logs}
        history.append(logs)
        metrics.write(json.dumps(logs) + "\n")
        metrics.flush()
        # Spent when another iteration and the closing evaluation would not fit in what is left of it.
        spent = cfg.cpu_budget_minutes > 0 and c0 is not None
        spent = spent and (
            time.process_time() - c0 + cost["iteration"] + cost["eval"] > cfg.cpu_budget_minutes * 60
        )
        if it % cfg.eval.every == 0 or it == cfg.iterations or spent:
            ev = run_eval(it)
            drift = ev["gap"] - evaluations[0]["gap"]
            # With rollouts in the simulator there is no world model to exploit: the gap is only reported.
            if cfg.rollouts == "imagination" and abs(drift) > cfg.eval.max_gap:
                policy.load_state_dict(good)
                rolled_back = True
                stopped = (
                    f"iteration {it}: imagined - sim success moved by {drift:+.2f} since BC "
                    f"(> max_gap {cfg.eval.max_gap}); "
                    f"rolled back to the weights of iteration {evaluations[-2]['iteration']}"
                )
                tqdm.write(stopped)
                break
            good = {k: v.clone() for k, v in policy.state_dict().items()}
            if best is not None and ev["imagined_success"] > best["imagined_success"]:
                best = ev
                keep_best(ev)
            loop_state = {
                "rng": rng.bit_generator.state, "history": history, "evaluations": evaluations,
                "train_sim_steps": train_sim_steps, "seconds": time.perf_counter() - t0,
            }  # fmt: skip
            if c0 is not None:
                loop_state["cpu_seconds"] = time.process_time() - c0
            save_checkpoint(out, trainer, loop_state, cfg.keep_checkpoints)
            if spent:
                stopped = f"iteration {it}: CPU budget of {cfg.cpu_budget_minutes:g} minutes spent"
                tqdm.write(stopped)
                break
    metrics.close()
    if rollout_env is not env:
        rollout_env.close()
    if cfg.rollouts == "imagination" and train_sim_steps != 0:
        raise RuntimeError(
            f"training stepped the simulator {train_sim_steps} times; it must use imagination only"
        )
    after = evaluations[-2] if rolled_back else evaluations[-1]
    if best is not None and best["iteration"] != after["iteration"]:
        load_model_weights(policy, best_dir / "pretrained_model" / "model.safetensors")
        after = best
        tqdm.write(f"kept the weights of iteration {best['iteration']}: the highest imagined success")
    policy.save_pretrained(out / "pretrained_model")
    summary = {
        "policy": cfg.policy.path,
        "world_model": cfg.world_model,
        "iterations_run": len(history),
        "rollouts": cfg.rollouts,
        "train_sim_steps": train_sim_steps,
        "eval_sim_steps": sum(e["sim_steps"] for e in evaluations),
        "algorithm": cfg.algorithm.type,
        "imagined_env_steps_per_iteration": cfg.episodes_per_iteration * cfg.env.horizon,
        "wall_seconds": time.perf_counter() - t0,
        "cpu_seconds": None if c0 is None else time.process_time() - c0,
        "stopped": stopped,
        # what the judge said of the training rollouts: NFT / GRPO learn only from starts with mixed outcomes
        "training_rollouts": training_rollout_figures(history),
        "before": evaluations[0],
        "after": after,
        "kept": cfg.eval.keep,
        "evaluations": evaluations,
        "config": asdict(cfg),
    }
    save_json(summary, out / "summary.json")
    plot_learning_curve(history, evaluations, out / "learning_curve.png", trainer.algorithm)
    return summary


def finished_run(cfg: FinetunePolicyConfig) -> dict | None:
    """The summary of a run of exactly `cfg` that finished in `cfg.output_dir` (its summary.json records the same
    config and its pretrained_model/ is written), else None: a benchmark run again after an interruption reuses
    its finished seeds instead of training them again. `cfg` is validated first, so that its defaults are filled
    as the finished run's were."""
    cfg.validate()
    out = Path(cfg.output_dir)
    if not (out / "summary.json").is_file() or not (out / "pretrained_model" / "model.safetensors").is_file():
        return None
    summary = load_json(out / "summary.json")
    return summary if summary.get("config") == json.loads(json.dumps(asdict(cfg))) else None


def training_rollout_figures(history: list[dict]) -> dict:
    """Imagined success and the share of start states with mixed outcomes, averaged over the iterations run."""

    def mean(key: str) -> float | None:
        values = [h[key] for h in history if key in h]
        return sum(values) / len(values) if values else None

    return {
        "imagined_success_mean": mean("imagined/success"),
        "mixed_starts_mean": mean("imagined/mixed_starts"),
    }


def plot_learning_curve(
    history: list[dict], evaluations: list[dict], path: Path, algorithm: str = "GRPO"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    if history:
        trained = [h["iteration"] for h in history]
        ax.plot(trained, [h["imagined/success"] for h in history], color="tab:blue",
                alpha=0.4, label="imagined success (training rollouts)")  # fmt: skip
        # where rollouts of one start state disagree: the only starts a group baseline learns from
        ax.plot(trained, [h.get("imagined/mixed_starts", float("nan")) for h in history], color="tab:gray",
                alpha=0.5, linestyle=":", label="start states with mixed outcomes")  # fmt: skip
    its = [e["iteration"] for e in evaluations]
    for key, colour, label in (("imagined_success", "tab:blue", "imagined (held-out)"), ("sim_success", "tab:red", "sim (held-out)")):  # fmt: skip
        lo = [e[key] - e[f"{key}_ci95"][0] for e in evaluations]
        hi = [e[f"{key}_ci95"][1] - e[key] for e in evaluations]
        ax.errorbar(
            its,
            [e[key] for e in evaluations],
            yerr=[lo, hi],
            color=colour,
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xlabel(f"{algorithm} iteration (imagination only)")
    ax.set_ylabel("success rate (dotted: share of start states)")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
