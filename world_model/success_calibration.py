"""The success threshold of the outcome heads, calibrated on the model's replays of held-out episodes.

An imagined episode succeeds when the success head's probability crosses a threshold at any of its steps.
Per frame the heads are well calibrated, but over ~50 steps a few false alarms add up: a policy that
hovers near the cube without touching it is called successful. Measured on reach (tiny world model, the
policy zoo, 20 episodes each): at 0.5 the three weak policies (15-30% in the sim) were imagined at
40-75%; at 0.9 at 25-30%, and Pearson with the sim went from 0.72 to 0.96.

The threshold is chosen without any policy: each held-out episode of the heads' dataset is replayed open
loop from its first frame under its recorded actions (`WorldModelEnv`, as in imagination, without ending
the episode at a success), and the candidate threshold whose episode verdicts (max probability over the
episode above it) best agree with the recorded outcomes (any `next.success`) wins; agreement is balanced
accuracy, so a dataset of mostly successes or mostly failures does not push it to either end.

How firm the pick is: when balanced accuracy is nearly flat across the candidates, one or two replays decide
between distant thresholds. The report therefore also gives the share of bootstrap resamples of the
replayed episodes (same size, drawn with replacement) in which each candidate wins.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from worldloop.common.stats import auroc
from worldloop.data.dataset import EpisodeDataset
from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import (
    WorldModelEnv,
    WorldModelEnvConfig,
    replay_episodes,
)

CANDIDATES = tuple(round(float(t), 2) for t in np.arange(0.5, 0.96, 0.05))


def balanced_accuracy(predicted: np.ndarray, actual: np.ndarray) -> float:
    """Mean of the true-positive and true-negative rates (a class that is absent is left out)."""
    rates = [float((predicted[actual == c] == c).mean()) for c in (True, False) if (actual == c).any()]
    return float(np.mean(rates))


@torch.no_grad()
def replay_max_success(
    model: WorldModel, dataset: EpisodeDataset, episodes: list[int], batch_size: int = 16, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Each episode replayed open loop from its first frame: (max success probability over its steps,
    whether it succeeded in the recording), both [len(episodes)]."""
    table = dataset.frame_table()
    selected = dataset.select_episodes(episodes)
    by_length: dict[int, list[int]] = {}
    for ep in selected:
        if ep.length >= 2:
            by_length.setdefault(ep.length, []).append(ep.index)
    found, recorded = {}, {}
    bar = tqdm(total=sum(len(g) for g in by_length.values()), desc="calibrating success", unit="episode")
    for length, group in by_length.items():
        env = WorldModelEnv(model, WorldModelEnvConfig(horizon=length - 1, terminate_on_success=False))
        results = replay_episodes(
            env, dataset, group, length - 1, batch_size, seed, chunk=length - 1, bar=bar
        )
        for index, result in zip(group, results):
            ep = dataset.episodes[index]
            found[index] = result["max_success_prob"]
            recorded[index] = bool(table.success[ep.start : ep.end].any())
    bar.close()
    kept = [ep.index for ep in selected if ep.index in found]
    return np.array([found[e] for e in kept]), np.array([recorded[e] for e in kept])


def best_candidate(accuracies: list[float], candidates: tuple[float, ...]) -> int:
    """Index of the candidate with the best balanced accuracy; ties go to the lowest threshold."""
    return max(range(len(candidates)), key=lambda i: (accuracies[i], -candidates[i]))


def bootstrap_picks(
    max_prob: np.ndarray, recorded: np.ndarray, candidates: tuple[float, ...], resamples: int, seed: int = 0
) -> dict[str, float]:
    """Share of `resamples` bootstrap resamples of the episodes in which each candidate is picked (as the
    calibration picks); resamples that hold a single outcome are redrawn."""
    rng = np.random.default_rng(seed)
    wins = np.zeros(len(candidates))
    while wins.sum() < resamples:
        idx = rng.integers(0, len(recorded), size=len(recorded))
        actual = recorded[idx]
        if actual.all() or not actual.any():
            continue
        accuracies = [balanced_accuracy(max_prob[idx] > t, actual) for t in candidates]
        wins[best_candidate(accuracies, candidates)] += 1
    return {f"{t:g}": float(w / resamples) for t, w in zip(candidates, wins)}


def calibrate_success_threshold(
    model: WorldModel,
    dataset: EpisodeDataset,
    episodes: list[int],
    candidates: tuple[float, ...] = CANDIDATES,
    resamples: int = 1000,
) -> dict:
    """The candidate threshold with the best balanced accuracy on `episodes` (ties: the lowest), the table
    behind the choice and the bootstrap share of each candidate's wins. Needs both successful and failed
    episodes."""
    max_prob, recorded = replay_max_success(model, dataset, episodes)
    if recorded.all() or not recorded.any():
        raise ValueError(
            f"calibrating the success threshold needs successful and failed episodes; the {len(recorded)} "
            f"replayed episodes of {dataset.root} are all {'successes' if recorded.all() else 'failures'}"
        )
    table = [
        {
            "threshold": t,
            "balanced_accuracy": balanced_accuracy(max_prob > t, recorded),
            "imagined_success": float((max_prob > t).mean()),
        }
        for t in candidates
    ]
    best = table[best_candidate([row["balanced_accuracy"] for row in table], candidates)]
    return {
        "threshold": best["threshold"],
        "episodes": len(recorded),
        "recorded_success": float(recorded.mean()),
        # Threshold-free: whether the replays' max success probability separates the episodes at all.
        "episode_auroc": auroc(max_prob, recorded),
        "candidates": table,
        "bootstrap_picks": bootstrap_picks(max_prob, recorded, candidates, resamples),
    }
