"""Does imagination tell a start's better rollouts from its worse? The signal RL in imagination learns from.

GRPO and NFT compare the rollouts of one start state (a group); PPO and steering compare each rollout with a
value of its start. Each learns only where imagination orders the rollouts of one start as the world would.
Pooled figures (the replays' AUROC, the ranking's) mix starts that are easy or hard whatever the policy does,
which a judge can tell apart from the first frame alone; they can be high while the comparisons RL makes are
no better than chance.

Here each start is imagined `group_size` times with the policy's own sampling noise, in the env RL collects in
(success ends an episode), and each episode's commanded actions are played in the simulator from the same reset
(`imagined_actions_in_sim`). Every score imagination gives an episode is then compared with that sim verdict:

- within-start AUROC: of two rollouts of one start, one a sim success and one not, the chance the success
  scores higher (`common.stats.within_group_auroc`), with a bootstrap interval over starts;
- best of K: the sim success of each start's top-scored rollout against the mean of its rollouts (`base`) and
  the share of starts with any success (`oracle`): what picking by imagination would gain; `best_of_k_curve`
  gives it for every K up to the group size.

`replayed_sim_groups` separates the drawing from the closed loop (`--observe=replay`): the policy's own sim
rollouts, each replayed open loop in the world model and judged on the drawn frames; with a frame reading (for
push, the cube's distance to its square by colour) it also reads the sim's frames and the drawn ones apart from
the judge. `judged_sim_groups` is the judge's own share (`--observe=sim`): the rollouts run in the simulator and the same
judge reads the sim's frames, so the future is the real one and only the judge can order them wrong.

`paired_difference` compares two world models (or judges) on the same rollouts (the replay and sim modes,
whose rollouts do not depend on the world model): the within-start AUROC of one minus the other's, resampling
the same starts for both, so the starts' own noise cancels.

Scores (`SCORES`): the return RL is paid (`GroupSettings.paid`: `success_reward` x success + `progress_reward` x
final progress), the judge's highest success probability, and the reward head's final progress.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from worldloop.common.rng import torch_seeded
from worldloop.common.stats import auroc, cluster_bootstrap_ci, within_group_auroc
from worldloop.data.features import image_key
from worldloop.rl_finetune.imagination.evaluation import imagine_episodes
from worldloop.rl_finetune.imagination.judged_sim import evaluate_judged_in_sim
from worldloop.rl_finetune.imagination.policy_ranking import imagined_actions_in_sim
from worldloop.vla.policy import Policy
from worldloop.vla.sim_evaluation import SimEvalConfig
from worldloop.world_model.model import WorldModel
from worldloop.world_model.world_model_env import FrameReading, InitialStates, WorldModelEnv, replay_actions

SCORES = ("return", "max_success_prob", "progress")
UNSEEN = 1e3  # a frame reading where nothing was found counts as this far


@dataclass(frozen=True)
class GroupSettings:
    """How every start's rollouts are drawn, and what RL pays for one."""

    group_size: int = 8  # rollouts per start (GRPO's and NFT's default group)
    starts_per_batch: int = 2  # starts rolled out together (batch = starts_per_batch x group_size)
    success_reward: float = 1.0  # RL's return weights (policy RL's defaults)
    progress_reward: float = 0.5

    def __post_init__(self):
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size}: a start needs at least 2 rollouts to compare")

    def paid(self, episode: dict) -> float:
        """RL's return for an episode with `success` and `progress`."""
        return self.success_reward * episode["success"] + self.progress_reward * episode["progress"]

    def batches(self, n: int) -> Iterator[tuple[int, list[int]]]:
        """(b, the start indices of batch b) over `n` starts, `starts_per_batch` a batch."""
        for b, first in enumerate(range(0, n, self.starts_per_batch)):
            yield b, list(range(first, min(first + self.starts_per_batch, n)))


def imagine_groups(
    policy: Policy, env: WorldModelEnv, starts: InitialStates, seed: int, groups: GroupSettings
) -> list[dict]:
    """`groups.group_size` imagined episodes of every start, in start order ([s0 x K, s1 x K, ...]); each is
    `imagine_episodes`' result plus `start` (its index) and `return` (what RL is paid for it). Batch b of
    `groups.starts_per_batch` starts is seeded `seed + b`."""
    episodes: list[dict] = []
    bar = tqdm(total=starts.batch_size, desc="imagined groups")
    for b, rows in groups.batches(starts.batch_size):
        batch, _ = imagine_episodes(policy, env, starts.select(rows).repeat(groups.group_size), seed + b)
        for i, episode in enumerate(batch):
            episode["start"] = rows[i // groups.group_size]
            episode["return"] = groups.paid(episode)
        episodes += batch
        bar.update(len(rows))
    bar.close()
    return episodes


def replayed_sim_groups(
    policy: Policy,
    env: WorldModelEnv,
    sim_env,
    starts: InitialStates,
    seed: int,
    groups: GroupSettings,
    reading: FrameReading | None = None,
) -> tuple[list[dict], list[bool]]:
    """`groups.group_size` rollouts of every start in `sim_env` (a `policy_rl.sim_rollouts.SimRolloutEnv`; the policy's
    noise of batch b seeded `seed + b`), each replayed open loop in `env` from its start (`replay_actions`,
    judged on the drawn frames); returns the episodes (`start`, the judge's `success`, `progress`,
    `max_success_prob`, `return`) and their labels, the sim's success. With `reading` (frames [B, T, 3, H, W]
    -> [B, T], smaller nearer success, NaN unseen) each episode also gets `reading_real` and `reading_drawn`:
    minus its least value over the chunks' ends, in the sim's frames and in the drawn ones (unseen: `UNSEEN`)."""
    camera, chunk = env.cameras[0], policy.n_action_steps
    episodes: list[dict] = []
    labels: list[bool] = []
    bar = tqdm(total=starts.batch_size, desc="sim rollouts replayed")
    for b, rows in groups.batches(starts.batch_size):
        batch = starts.select(rows).repeat(groups.group_size)
        actions, real = [], []
        with torch_seeded(seed + b):
            obs = sim_env.reset(batch)
            while not sim_env.done.all():
                actions.append(policy.predict_action_chunk(obs)[:, :chunk])
                obs, *_ = sim_env.step(actions[-1])  # an ended episode's frame stays its last
                if reading is not None:
                    real.append(reading(obs[image_key(camera)][:, None], batch.task)[:, 0])
        labels += sim_env.succeeded.tolist()
        played = torch.cat(actions, 1)[:, : env.config.horizon]
        replayed = replay_actions(env, batch, played, seed + b, frame_reading=reading)
        for i, r in enumerate(replayed):
            episode = {
                "start": rows[i // groups.group_size],
                **{k: r[k] for k in ("success", "progress", "max_success_prob")},
                "return": groups.paid(r),
            }
            if reading is not None:
                drawn = torch.tensor(r["frame_reading"])[chunk - 1 :: chunk]  # the chunks' ends, as the real
                episode["reading_real"] = -float(torch.stack(real, 1)[i].nan_to_num(UNSEEN).min())
                episode["reading_drawn"] = -float(drawn.nan_to_num(UNSEEN).min())
            episodes.append(episode)
        bar.update(len(rows))
    bar.close()
    return episodes, labels


def judged_sim_groups(
    policy: Policy,
    world_model: WorldModel,
    threshold: float,
    sim_cfg: SimEvalConfig,
    start_seeds: Sequence[int],
    seed: int,
    groups: GroupSettings,
) -> tuple[list[dict], list[bool]]:
    """`groups.group_size` sim episodes from every start's reset (`sim_cfg.batch_envs` stepped together, the policy's
    noise seeded from `seed`), judged by `world_model`'s heads on the sim's frames (`evaluate_judged_in_sim`);
    returns the episodes (with `start` and `return`, as `imagine_groups`) and their labels: the sim's success
    over the steps the judge read, as a replay of an imagined episode's actions is."""
    env_seeds = [s for s in start_seeds for _ in range(groups.group_size)]
    judged = evaluate_judged_in_sim(
        policy, world_model, threshold, sim_cfg, len(env_seeds), seed, env_seeds=env_seeds
    )
    episodes = judged["per_episode"]
    for i, episode in enumerate(episodes):
        episode["start"] = i // groups.group_size
        episode["return"] = groups.paid(episode)
    return episodes, [e["sim_success_judged"] for e in episodes]


def reading_response(episodes: Sequence[dict]) -> dict[str, float]:
    """How the drawn replays' frame reading follows the sim's across a start's rollouts (`replayed_sim_groups`
    with a reading): each reading less its start's mean, the correlation of drawn with real and the least-squares
    slope of drawn on real. A slope of 1 draws rollouts as far apart as the world puts them; under 1 the drawing
    pulls them toward the start's average, so what tells them apart shrinks. Episodes unseen in either reading
    (at `UNSEEN`) are left out."""
    real = np.asarray([e["reading_real"] for e in episodes], dtype=np.float64)
    drawn = np.asarray([e["reading_drawn"] for e in episodes], dtype=np.float64)
    start = np.asarray([e["start"] for e in episodes])
    seen = (np.abs(real) < UNSEEN) & (np.abs(drawn) < UNSEEN)
    for s in np.unique(start[seen]):
        member = seen & (start == s)
        real[member] -= real[member].mean()
        drawn[member] -= drawn[member].mean()
    real, drawn = real[seen], drawn[seen]
    spread = float((real * real).sum())
    both = spread * float((drawn * drawn).sum())
    return {
        "slope": float((real * drawn).sum()) / spread if spread else math.nan,
        "corr": float((real * drawn).sum()) / math.sqrt(both) if both else math.nan,
        "episodes": int(seen.sum()),
    }


def sim_verdicts(episodes: list[dict], sim_cfg: SimEvalConfig, start_seeds: Sequence[int]) -> dict:
    """Each episode's actions played in the sim from its start's reset (`imagined_actions_in_sim`)."""
    return imagined_actions_in_sim(episodes, sim_cfg, [start_seeds[e["start"]] for e in episodes])


def group_figures(
    episodes: list[dict], sim_success: Sequence[bool], n_boot: int = 2000, scores: Sequence[str] = SCORES
) -> dict:
    """What imagination's `scores` say about the sim's verdicts, within each start (the module docstring).

    episodes: `imagine_groups`' output (or `replayed_sim_groups`', `judged_sim_groups`'), every start with the
    same number of rollouts; sim_success: per episode, whether its actions succeeded in the sim."""
    success = np.asarray(sim_success, dtype=bool)
    start = np.asarray([e["start"] for e in episodes])
    if len(success) != len(start):
        raise ValueError(f"{len(episodes)} episodes but {len(success)} sim verdicts")
    starts = np.unique(start)
    members = [np.flatnonzero(start == s) for s in starts]
    if len({len(m) for m in members}) != 1:
        raise ValueError("every start needs the same number of rollouts")
    figures = {
        "starts": len(starts),
        "group_size": len(members[0]),
        "base": float(success.mean()),
        "oracle": float(np.mean([success[m].any() for m in members])),
        "mixed_starts": float(np.mean([success[m].any() and not success[m].all() for m in members])),
        "scores": {},
    }
    for name in scores:
        score = np.asarray([e[name] for e in episodes], dtype=np.float64)
        figures["scores"][name] = score_figures(score, success, members, n_boot)
    # a perfect pick's curve does not depend on the score
    figures["oracle_curve"] = best_of_k_curve(np.zeros(len(success)), success, members)["oracle"]
    return figures


def best_of_k_curve(
    score: np.ndarray, success: np.ndarray, members: list[np.ndarray]
) -> dict[str, list[float]]:
    """For K = 1..G (G rollouts a start), the expected sim success of the top-scored of K rollouts drawn at
    random without replacement from each start (`picked`; ties: the first rollout) and of a perfect pick
    (`oracle`: any success among the K), averaged over starts. Exact: the rollout ranked r-th of G is the top
    of a random K-subset with probability C(G-1-r, K-1) / C(G, K). K = 1 gives the base rate."""
    size = len(members[0])
    picked, oracle = np.zeros(size), np.zeros(size)
    for m in members:
        ranked = success[m][np.argsort(-score[m], kind="stable")]
        for k in range(1, size + 1):
            subsets = math.comb(size, k)
            picked[k - 1] += sum(ranked[r] * math.comb(size - 1 - r, k - 1) for r in range(size)) / subsets
            oracle[k - 1] += 1 - math.comb(size - int(ranked.sum()), k) / subsets
    return {"picked": (picked / len(members)).tolist(), "oracle": (oracle / len(members)).tolist()}


def within_starts(
    score: np.ndarray, success: np.ndarray, members: list[np.ndarray], index: np.ndarray
) -> dict:
    """`within_group_auroc` over the episodes of starts `index` (`members`: each start's episode indices); a start
    drawn twice, as a bootstrap draw may, counts as two groups."""
    rows = np.concatenate([members[i] for i in index])
    groups = np.concatenate([np.full(len(members[i]), j) for j, i in enumerate(index)])
    return within_group_auroc(score[rows], success[rows], groups)


def score_figures(score: np.ndarray, success: np.ndarray, members: list[np.ndarray], n_boot: int) -> dict:
    """One score's within-start AUROC and best-of-K gain (`members`: each start's episode indices)."""
    top = [m[np.argmax(score[m])] for m in members]  # ties: the first rollout

    def pick_gain(index: np.ndarray) -> float:
        rows = np.concatenate([members[i] for i in index])
        return float(np.mean([success[top[i]] for i in index]) - success[rows].mean())

    curve = best_of_k_curve(score, success, members)
    counts = within_starts(score, success, members, np.arange(len(members)))
    return {
        "within_start_auroc": {
            **cluster_bootstrap_ci(
                lambda index: within_starts(score, success, members, index)["value"], len(members), n_boot
            ),
            "pairs": counts["pairs"],
            "mixed_groups": counts["mixed_groups"],
        },
        "best_of_k": float(np.mean([success[t] for t in top])),
        "best_of_k_curve": curve["picked"],
        "best_of_k_minus_base": cluster_bootstrap_ci(pick_gain, len(members), n_boot),
        "pooled_auroc": auroc(score, success),
    }


def paired_difference(
    ours: Sequence[dict], theirs: Sequence[dict], scores: Sequence[str], n_boot: int = 2000
) -> dict[str, dict]:
    """Per score, our within-start AUROC minus theirs on the same rollouts, with a bootstrap interval over
    starts (each draw resamples the same starts for both).

    ours, theirs: per-episode rows ({"start", "sim_success", <score>: value}, and "start_seed" and "reading_real"
    where read), as the benchmark saves them; the two must list the same episodes (in order), else ValueError
    names the first row that differs."""
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} episodes against {len(theirs)}: not the same rollouts")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        mine, other = (  # the real reading to 4 decimals: the same frames, perhaps summed in another order
            (e["start"], e.get("start_seed"), bool(e["sim_success"]), round(e.get("reading_real", 0.0), 4))
            for e in (a, b)
        )
        if mine != other:
            raise ValueError(
                f"episode {i} differs ((start, start seed, sim success, real reading) {mine} vs {other}): "
                "not the same rollouts"
            )
    success = np.asarray([a["sim_success"] for a in ours], dtype=bool)
    start = np.asarray([a["start"] for a in ours])
    members = [np.flatnonzero(start == s) for s in np.unique(start)]

    def within(score: np.ndarray, index: np.ndarray) -> float:
        return within_starts(score, success, members, index)["value"]

    out = {}
    for name in scores:
        a = np.asarray([e[name] for e in ours], dtype=np.float64)
        b = np.asarray([e[name] for e in theirs], dtype=np.float64)
        out[name] = cluster_bootstrap_ci(
            lambda index, a=a, b=b: within(a, index) - within(b, index), len(members), n_boot
        )
    return out
