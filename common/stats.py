"""Confidence intervals for the figures worldloop reports: success rates, means over seeds, bootstrapped
statistics. Pure numpy and math, so every part may use them.

- `wilson_interval`: a binomial success rate over n episodes.
- `mean_ci`: a mean over a few independent runs (seeds), with Student's t, since 3 seeds are far too few
  for a normal or bootstrap interval.
- `auroc`, `auroc_ci`: whether a score separates two classes at all, whatever threshold is later put on
  it; the interval resamples within each class.
- `bootstrap_ci`: any statistic of grouped samples (e.g. a ranking correlation over policies whose success
  rates are each estimated from episodes), by resampling within each group.
- `within_group_auroc`, `cluster_bootstrap_ci`: whether a score orders the samples of one group (the rollouts
  of one start state) as their labels do, the only comparison a group baseline learns from; its interval
  resamples whole groups.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion (sane at 0 and n successes, unlike Wald's)."""
    if n <= 0:
        raise ValueError(f"wilson_interval needs n > 0 trials, got {n}")
    p = successes / n
    denom = 1 + z**2 / n
    centre = (p + z**2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance a random positive scores above a random negative (ties 1/2).

    NaN when one class is absent. Used to ask whether a success head separates successes from failures
    at all, whatever threshold turns its probability into a decision.
    """
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"expected 1-D scores and labels of equal length, got {s.shape} and {y.shape}")
    pos, neg = s[y], s[~y]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def _student_t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (Simpson's rule on the density; x >= 0)."""
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    n = 2000  # even; the density is smooth, so this is exact to ~1e-10 over the range used here
    h = x / n
    total = 0.0
    for i in range(n + 1):
        t = i * h
        f = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        total += f * (1 if i in (0, n) else 4 if i % 2 else 2)
    return 0.5 + total * h / 3


def student_t_quantile(p: float, df: int) -> float:
    """The p-quantile (0.5 < p < 1) of Student's t with `df` >= 1 degrees of freedom, by bisection."""
    if not 0.5 < p < 1:
        raise ValueError(f"student_t_quantile: p={p} must be in (0.5, 1)")
    if df < 1:
        raise ValueError(f"student_t_quantile: df={df} must be >= 1")
    lo, hi = 0.0, 1.0
    while _student_t_cdf(hi, df) < p:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _student_t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """Mean of independent runs with its Student-t interval: {mean, std, low, high, n}.

    One run has no spread to estimate: its interval is (-inf, inf), which says so instead of hiding it.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0 or not np.isfinite(x).all():
        raise ValueError(f"mean_ci needs a non-empty 1-D sequence of finite values, got {values!r}")
    mean = float(x.mean())
    if len(x) == 1:
        return {"mean": mean, "std": float("nan"), "low": -math.inf, "high": math.inf, "n": 1}
    std = float(x.std(ddof=1))
    half = student_t_quantile(0.5 + level / 2, len(x) - 1) * std / math.sqrt(len(x))
    return {"mean": mean, "std": std, "low": mean - half, "high": mean + half, "n": len(x)}


def bootstrap_ci(
    statistic: Callable[[list[np.ndarray]], float],
    groups: Sequence[Sequence[float]],
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Percentile bootstrap of `statistic(groups)`, resampling each group's samples with replacement.

    groups: e.g. per policy its episodes' outcomes (imagined and simulated policies as separate groups);
    the statistic sees one resampled array per group. Returns {value, low, high, n_boot, undefined}, where
    `undefined` counts resamples on which the statistic was NaN (a constant side makes a correlation
    undefined): they are left out of the interval, and the count says how often it happened.
    """
    arrays = [np.asarray(g, dtype=np.float64) for g in groups]
    if not arrays or any(a.ndim != 1 or len(a) == 0 for a in arrays):
        raise ValueError("bootstrap_ci needs non-empty 1-D groups of samples")
    if n_boot < 1:
        raise ValueError(f"bootstrap_ci: n_boot={n_boot} must be >= 1")
    rng = np.random.default_rng(seed)
    draws = [statistic([a[rng.integers(0, len(a), len(a))] for a in arrays]) for _ in range(n_boot)]
    return _percentile_interval(statistic(arrays), draws, level)


def _percentile_interval(value: float, draws: Sequence[float], level: float) -> dict[str, float]:
    """{value, low, high, n_boot, undefined}: the percentile interval of the finite bootstrap draws."""
    draws = np.asarray(draws, dtype=np.float64)
    finite = draws[np.isfinite(draws)]
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail]) if len(finite) else (math.nan, math.nan)
    return {
        "value": float(value),
        "low": float(low),
        "high": float(high),
        "n_boot": len(draws),
        "undefined": int(len(draws) - len(finite)),
    }


def auroc_ci(
    scores: Sequence[float], labels: Sequence[bool], n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> dict[str, float] | None:
    """`auroc` with a percentile bootstrap interval ({value, low, high, n_boot, undefined}, as
    `bootstrap_ci`), resampling positives and negatives separately so that every resample holds both
    classes. None when one class is absent (there is nothing to separate)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    if s.shape != y.shape or s.ndim != 1:
        raise ValueError(f"expected 1-D scores and labels of equal length, got {s.shape} and {y.shape}")
    if y.all() or not y.any():
        return None
    return bootstrap_ci(
        lambda g: auroc(np.concatenate(g), np.r_[np.ones(len(g[0]), bool), np.zeros(len(g[1]), bool)]),
        [s[y], s[~y]],
        n_boot=n_boot,
        level=level,
        seed=seed,
    )


def within_group_auroc(
    scores: Sequence[float], labels: Sequence[bool], groups: Sequence[int]
) -> dict[str, float]:
    """AUROC over the (positive, negative) pairs that share a group: the chance that, of two samples of one
    group with different labels, the positive scores higher (ties 1/2). Pairs across groups never count, so
    groups that are all easy or all hard cannot make it high (as they can the pooled `auroc`).

    Returns {value (NaN without a mixed group), pairs, mixed_groups}."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=bool)
    g = np.asarray(groups)
    if not s.shape == y.shape == g.shape or s.ndim != 1:
        raise ValueError(
            f"expected 1-D scores, labels and groups of equal length, got {s.shape}, {y.shape} and {g.shape}"
        )
    wins = pairs = 0.0
    mixed = 0
    for group in np.unique(g):
        member = g == group
        pos, neg = s[member & y], s[member & ~y]
        if len(pos) and len(neg):
            wins += (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
            pairs += len(pos) * len(neg)
            mixed += 1
    return {"value": float(wins / pairs) if pairs else math.nan, "pairs": int(pairs), "mixed_groups": mixed}


def cluster_bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    n_clusters: int,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """Percentile bootstrap over whole clusters (e.g. start states, whose rollouts are not independent):
    `statistic(index)` sees an array of `n_clusters` cluster indices drawn with replacement (the identity
    for the point value). Returns {value, low, high, n_boot, undefined}, as `bootstrap_ci`."""
    if n_clusters < 1 or n_boot < 1:
        raise ValueError(f"cluster_bootstrap_ci: n_clusters={n_clusters} and n_boot={n_boot} must be >= 1")
    rng = np.random.default_rng(seed)
    draws = [statistic(rng.integers(0, n_clusters, n_clusters)) for _ in range(n_boot)]
    return _percentile_interval(statistic(np.arange(n_clusters)), draws, level)
