"""The closed loop: the policy's own sim episodes flow back into the world model, which then trains the
policy again in imagination.

    python finetune_policy.py --config configs/finetune/tiny.yaml --policy.path=... --world_model=... \
        --loop.rounds=3 --loop.dataset_root=outputs/data/reach --loop.episodes=20 \
        --loop.world_model_train.steps=200

Each round r = 1..N, starting from the BC policy and the given world model:
(a) run the current policy in the simulator for `loop.episodes` episodes (seeds disjoint from every
    evaluation) and record them with `vla.sim_recording` (the sim's episode loop and the one dataset
    writer, `data.recording.EpisodeWriter`: failures kept, `next.success` labelled);
(b) grow the world model's data: a new LeRobotDataset holding the previous round's data and these episodes
    (`data.recording.grow_dataset` into `round_<r>/dataset`; the given dataset is never modified);
(c) fine-tune the world model on the grown data for `loop.world_model_train.steps` steps from its current
    weights (`world_model.trainer.open_dataset` + the shared training loop `common.training.run_training`),
    or its outcome heads alone (`loop.heads_only`), then optionally calibrate its success threshold again
    (`loop.calibrate_success`);
(d) fine-tune the policy in imagination in the new world model (`policy_rl.finetune.finetune`: GRPO, PPO or NFT,
    evaluated in imagination and in the sim before and after, with its divergence guard).

The sim is used for (a) and for evaluation only. Sim steps are counted in three bins: collection (a),
evaluation (inside (d)), and training ((c) and the RL updates of (d)), which must stay 0.

Writes under output_dir: `round_<r>/` (sim_episodes, dataset, world_model, policy, round.json),
`closed_loop.json` (every round, updated after each) and `closed_loop.png` (sim success and the
imagined-vs-sim gap per round; round 0 is the starting policy, evaluated at the start of round 1's
policy fine-tune, i.e. imagined in round 1's world model).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
from torch.utils.data import ConcatDataset, Dataset, Subset

from worldloop.common.checkpoint import save_json
from worldloop.common.training import run_training
from worldloop.data.dataset import DatasetConfig
from worldloop.data.features import IMAGE_PREFIX
from worldloop.data.recording import grow_dataset
from worldloop.data.windows import WorldModelWindows
from worldloop.rl_finetune.closed_loop_config import LoopConfig
from worldloop.rl_finetune.policy_rl.finetune import FinetunePolicyConfig, PolicyPath, finetune
from worldloop.rl_finetune.sim_steps import count_sim_steps
from worldloop.vla.factory import load_policy
from worldloop.vla.sim_recording import record_policy_episodes as record_sim_episodes
from worldloop.world_model.model import WorldModel
from worldloop.world_model.trainer import TrainWorldModelConfig, calibrate_exported, open_dataset


def recorded_cameras(dataset_root: str) -> tuple[tuple[str, ...], int]:
    """The cameras and (square) image size of the world model's dataset: the recordings must match them."""
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(f"local/{Path(dataset_root).name}", root=dataset_root)
    cams = {k: f for k, f in meta.features.items() if k.startswith(IMAGE_PREFIX)}
    if not cams or any(f["dtype"] != "image" for f in cams.values()):
        raise ValueError(
            f"loop.dataset_root={dataset_root}: the loop appends episodes recorded as images; its camera "
            f"features are {[(k, f['dtype']) for k, f in cams.items()]}"
        )
    sizes = {tuple(f["shape"][:2]) for f in cams.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 2 or len(set(next(iter(sizes)))) != 1:
        raise ValueError(f"loop.dataset_root={dataset_root}: cameras must share one square size, got {sizes}")
    return tuple(k[len(IMAGE_PREFIX) :] for k in cams), next(iter(sizes))[0]


def record_policy_episodes(
    cfg: FinetunePolicyConfig, policy_path: str, root: Path, seeds: list[int]
) -> list[dict]:
    """(a): the policy at `policy_path` in the sim, one episode per seed, recorded at `root`."""
    cameras, size = recorded_cameras(cfg.loop.dataset_root)
    policy = load_policy(policy_path, cfg.device)
    env_cfg = cfg.eval.sim.env_config(size, cameras, cfg.loop.terminate_on_success)
    return record_sim_episodes(policy, env_cfg, root, seeds, cfg.device)


def oversampled(windows: WorldModelWindows, first_recorded: int, fraction: float) -> tuple[Dataset, int]:
    """`windows` plus copies of those from episodes `first_recorded` on, so that about `fraction` of the
    items come from those episodes; `windows` alone when fraction is 0 or none of them is there. Returns
    the dataset and how many of `windows` are recorded ones."""
    recorded = [i for i, (episode, _) in enumerate(windows.starts) if 0 <= first_recorded <= episode]
    if fraction <= 0 or not recorded:
        return windows, len(recorded)
    others = len(windows) - len(recorded)
    copies = max(0, round(fraction * others / (1 - fraction) / len(recorded)) - 1)
    return ConcatDataset([windows, *[Subset(windows, recorded)] * copies]), len(recorded)


def finetune_world_model(
    world_model: str, dataset_root: Path, loop: LoopConfig, out: Path, device: str, first_recorded: int = -1
) -> tuple[Path, dict]:
    """(c): the world model at `world_model`, trained `loop.world_model_train.steps` more steps on the
    training episodes of `dataset_root` (its outcome heads alone with `loop.heads_only`), its success
    threshold then calibrated again on the held-out episodes with `loop.calibrate_success`; returns the new
    pretrained world model's directory, the training loss averaged over the first and the last tenth of
    the steps, and the success threshold before and after. Episodes from index `first_recorded` on are the
    loop's recordings, oversampled to `loop.recorded_fraction` of the windows."""
    model = WorldModel.from_pretrained(world_model, device).train()
    train_cfg = TrainWorldModelConfig(
        dataset=DatasetConfig(root=str(dataset_root), held_out_fraction=loop.held_out_fraction),
        model=model.cfg,
        train=loop.world_model_train,
        window=loop.window,
        output_dir=str(out),
    )
    dataset = open_dataset(train_cfg)
    train_episodes, held_out = dataset.split()
    windows = WorldModelWindows(dataset, train_episodes, context=1, horizon=loop.window - 1)
    training_windows, recorded = oversampled(windows, first_recorded, loop.recorded_fraction)
    if loop.heads_only:
        model.freeze_all_but_heads()
    losses: list[float] = []

    def loss_fn(m, batch):
        loss, logs = m(batch, heads_only=loop.heads_only)
        losses.append(loss.item())
        return loss, logs

    model = run_training(  # the EMA weights it saved
        model,
        training_windows,
        loss_fn=loss_fn,
        cfg=loop.world_model_train,
        output_dir=out,
        save_pretrained=lambda m, path: m.save_pretrained(path),
    )
    threshold = model.cfg.heads.success_threshold
    if loop.calibrate_success:
        # The sampler's still-pixel threshold stays the one the model came with.
        calibrate_exported(
            model, dataset, train_episodes, held_out, dataclasses.replace(train_cfg, still_windows=0)
        )
    tenth = max(1, len(losses) // 10)
    return out / "pretrained_model", {
        "loss_first_tenth": float(np.mean(losses[:tenth])),
        "loss_last_tenth": float(np.mean(losses[-tenth:])),
        "train_episodes": len(train_episodes),
        "windows": len(windows),
        "recorded_windows": recorded,
        "training_windows": len(training_windows),
        "heads_only": loop.heads_only,
        "success_threshold": [threshold, model.cfg.heads.success_threshold],
    }


def _check_seeds(cfg: FinetunePolicyConfig) -> None:
    loop, ev = cfg.loop, cfg.eval
    first, last = loop.seed, loop.seed + loop.rounds * loop.episodes - 1
    for name, a, b in (
        ("eval", ev.seed, ev.seed + ev.episodes - 1),
        ("starts", cfg.starts.seed, cfg.starts.seed + cfg.starts.count - 1),
    ):
        if first <= b and a <= last:
            raise ValueError(
                f"loop seeds {first}..{last} (rounds x episodes) overlap the {name} seeds {a}..{b}; "
                "move loop.seed"
            )


def _dataset_size(root: Path) -> dict:
    from lerobot.datasets.lerobot_dataset import LeRobotDatasetMetadata

    meta = LeRobotDatasetMetadata(f"local/{root.name}", root=root)
    return {"root": str(root), "episodes": meta.total_episodes, "frames": meta.total_frames}


def run_closed_loop(cfg: FinetunePolicyConfig) -> dict:
    """N rounds of record -> grow data -> fine-tune world model -> fine-tune policy; see the docstring."""
    cfg.validate()
    loop = cfg.loop
    if loop.rounds < 1:
        raise ValueError("run_closed_loop needs loop.rounds >= 1")
    if cfg.resume:
        raise ValueError("resume=true is for a single fine-tune; the closed loop starts from round 1")
    if cfg.starts.source == "sim":
        _check_seeds(cfg)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    policy_path, world_model, data_root = cfg.policy.path, cfg.world_model, Path(loop.dataset_root)
    initial = {"policy": policy_path, "world_model": world_model, "dataset": _dataset_size(data_root)}
    rounds: list[dict] = []
    t_start = time.perf_counter()
    for r in range(1, loop.rounds + 1):
        t0 = time.perf_counter()
        rdir = out / f"round_{r}"
        seeds = [loop.seed + (r - 1) * loop.episodes + i for i in range(loop.episodes)]
        with count_sim_steps() as collection:
            episodes = record_policy_episodes(cfg, policy_path, rdir / "sim_episodes", seeds)
        data_root = grow_dataset([data_root, rdir / "sim_episodes"], rdir / "dataset")
        t1 = time.perf_counter()
        with count_sim_steps() as wm_training:
            wm_path, wm_logs = finetune_world_model(
                world_model, data_root, loop, rdir / "world_model", cfg.device, initial["dataset"]["episodes"]
            )
        world_model = str(wm_path)
        t2 = time.perf_counter()
        round_cfg = dataclasses.replace(
            cfg,
            policy=PolicyPath(str(policy_path)),
            world_model=world_model,
            output_dir=str(rdir / "policy"),
            reference_policy=cfg.reference_policy or (cfg.policy.path if loop.kl_to_original_bc else ""),
            loop=LoopConfig(),
        )
        summary = finetune(round_cfg)
        policy_path = str(rdir / "policy" / "pretrained_model")
        successes = sum(bool(e["success"]) for e in episodes)
        record = {
            "round": r,
            "recorded": {
                "root": str(rdir / "sim_episodes"), "episodes": len(episodes), "successes": successes,
                "sim_success": successes / len(episodes), "frames": sum(e["length"] for e in episodes),
                "seeds": [seeds[0], seeds[-1]], "sim_steps": collection.steps,
            },
            "dataset": _dataset_size(data_root),
            "world_model": {"path": world_model, "steps": loop.world_model_train.steps, **wm_logs,
                            "sim_steps": wm_training.steps, "seconds": t2 - t1},
            "policy": {"path": policy_path, "algorithm": cfg.algorithm.type,
                       "iterations_run": summary["iterations_run"], "stopped": summary["stopped"],
                       "train_sim_steps": summary["train_sim_steps"], "eval_sim_steps": summary["eval_sim_steps"],
                       "seconds": summary["wall_seconds"]},
            "before": summary["before"],
            "after": summary["after"],
            "train_sim_steps": wm_training.steps + summary["train_sim_steps"],
            "seconds": time.perf_counter() - t0,
        }  # fmt: skip
        save_json(record, rdir / "round.json")
        rounds.append(record)
        result = _summary(cfg, initial, rounds, time.perf_counter() - t_start)
        save_json(result, out / "closed_loop.json")
        plot_rounds(rounds, out / "closed_loop.png")
        if record["train_sim_steps"]:
            raise RuntimeError(
                f"round {r}: training stepped the simulator {record['train_sim_steps']} times; "
                "only recording and evaluation may"
            )
    return result


def _summary(cfg: FinetunePolicyConfig, initial: dict, rounds: list[dict], seconds: float) -> dict:
    return {
        "initial": initial,
        "final": {"policy": rounds[-1]["policy"]["path"], "world_model": rounds[-1]["world_model"]["path"]},
        "rounds": rounds,
        "sim_steps": {
            "training": sum(r["train_sim_steps"] for r in rounds),
            "collection": sum(r["recorded"]["sim_steps"] for r in rounds),
            "evaluation": sum(r["policy"]["eval_sim_steps"] for r in rounds),
        },
        "wall_seconds": seconds,
        "config": dataclasses.asdict(cfg),
    }


def plot_rounds(rounds: list[dict], path: Path) -> None:
    """Sim success (95% CI) and imagined - sim success per round; round 0 is the starting policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [rounds[0]["before"]] + [r["after"] for r in rounds]
    x = list(range(len(evals)))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6, 5.5), sharex=True)
    for key, colour, label in (("sim_success", "tab:red", "sim (held-out)"),
                               ("imagined_success", "tab:blue", "imagined (held-out)")):  # fmt: skip
        y = [e[key] for e in evals]
        err = [
            [v - e[f"{key}_ci95"][0] for v, e in zip(y, evals)],
            [e[f"{key}_ci95"][1] - v for v, e in zip(y, evals)],
        ]
        top.errorbar(x, y, yerr=err, color=colour, marker="o", capsize=3, label=label)
    # Round r records the policy that round r - 1 produced: plotted at r - 1.
    top.plot([r["round"] - 1 for r in rounds], [r["recorded"]["sim_success"] for r in rounds], color="tab:gray",
             marker="s", linestyle=":", label="sim (episodes recorded for the world model)")  # fmt: skip
    top.set_ylabel("success rate")
    top.set_ylim(-0.05, 1.05)
    top.legend(fontsize=7)
    bottom.axhline(0, color="black", linewidth=0.5)
    bottom.plot(x, [e["gap"] for e in evals], color="tab:purple", marker="o")
    bottom.set_ylabel("imagined - sim success")
    bottom.set_xlabel("round (0: before the loop)")
    bottom.set_xticks(x)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
