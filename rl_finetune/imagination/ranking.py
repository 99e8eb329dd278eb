"""How well a proxy evaluator (imagination) ranks policies like the reference (the simulator, or reality).

SIMPLER (Li et al., 2024) reports, per set of policies, the Pearson correlation of the success rates and
the mean maximum rank violation (MMRV): for each policy, the largest reference-success gap to any other
policy that the proxy orders the wrong way round, averaged over policies. MMRV is 0 when the proxy orders
every pair as the reference does and grows with how much success the misordered pairs are apart, so a
swap of two near-equal policies costs little and a swap of a strong and a weak one costs a lot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from worldloop.common.stats import bootstrap_ci


def _pair(proxy: Sequence[float], reference: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(proxy, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError(f"expected two 1-D sequences of equal length, got shapes {x.shape} and {y.shape}")
    if len(x) < 2:
        raise ValueError(f"ranking metrics need at least 2 policies, got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("ranking metrics need finite success rates")
    return x, y


def pearson(proxy: Sequence[float], reference: Sequence[float]) -> float:
    """Pearson r; NaN when either side is constant (a correlation is undefined then)."""
    x, y = _pair(proxy, reference)
    xc, yc = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((xc**2).sum() * (yc**2).sum()))
    return float((xc * yc).sum() / denom) if denom > 0 else float("nan")


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, ties sharing the mean of the ranks they span (as scipy.stats.rankdata)."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    ranks = np.empty(len(v))
    i = 0
    while i < len(v):
        j = i
        while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(proxy: Sequence[float], reference: Sequence[float]) -> float:
    """Spearman rho: Pearson r of the (tie-averaged) ranks."""
    x, y = _pair(proxy, reference)
    return pearson(average_ranks(x), average_ranks(y))


def mmrv(proxy: Sequence[float], reference: Sequence[float]) -> float:
    """Mean maximum rank violation (SIMPLER), in the units of the reference success rates.

    violation(i, j) = |ref_i - ref_j| if the proxy orders i and j differently from the reference, else 0;
    MMRV = mean_i max_j violation(i, j). A pair tied on one side and not the other is misordered.
    """
    x, y = _pair(proxy, reference)
    misordered = (x[:, None] < x[None, :]) != (y[:, None] < y[None, :])
    violation = np.abs(y[:, None] - y[None, :]) * misordered
    return float(violation.max(axis=1).mean())


def ranking_report(proxy: Sequence[float], reference: Sequence[float]) -> dict[str, float]:
    x, y = _pair(proxy, reference)
    return {
        "pearson": pearson(x, y),
        "spearman": spearman(x, y),
        "mmrv": mmrv(x, y),
        "max_abs_gap": float(np.abs(x - y).max()),
        "mean_abs_gap": float(np.abs(x - y).mean()),
    }


def ranking_cis(
    proxy_outcomes: Sequence[Sequence[float]],
    reference_outcomes: Sequence[Sequence[float]],
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Pearson, Spearman and MMRV of the per-policy means, each with a 95% percentile-bootstrap interval.

    proxy_outcomes / reference_outcomes: per policy, its episodes' outcomes (success 0/1, or a score such as
    max coverage) in imagination and in the reference. Each resample redraws every policy's episodes on both
    sides independently, so the intervals carry the episode noise of both evaluations (see
    `common.stats.bootstrap_ci`, whose dicts this returns per metric).
    """
    if len(proxy_outcomes) != len(reference_outcomes):
        raise ValueError(
            f"ranking_cis: {len(proxy_outcomes)} policies in imagination but {len(reference_outcomes)} in the reference"
        )
    n = len(proxy_outcomes)
    groups = [*proxy_outcomes, *reference_outcomes]

    def metric(fn):
        return lambda gs: fn([g.mean() for g in gs[:n]], [g.mean() for g in gs[n:]])

    return {
        name: bootstrap_ci(metric(fn), groups, n_boot=n_boot, seed=seed)
        for name, fn in (("pearson", pearson), ("spearman", spearman), ("mmrv", mmrv))
    }


def disagreement(imagined: dict, reference: dict, reference_name: str = "sim") -> str | None:
    """None when the success 95% intervals of two evaluation summaries of one policy overlap (`success_rate`
    and `success_ci95` [lo, hi] each: imagination's, and the simulator's or env's); else a sentence with
    both numbers, for the result JSON and the report."""
    return interval_disagreement(
        (imagined["success_rate"], *imagined["success_ci95"]),
        (reference["success_rate"], *reference["success_ci95"]),
        reference_name,
    )


def interval_disagreement(
    imagined: tuple[float, float, float], reference: tuple[float, float, float], reference_name: str = "sim"
) -> str | None:
    """`disagreement` for any figure in [0, 1] given as (value, low, high) on each side."""
    (i_value, i_lo, i_hi), (r_value, r_lo, r_hi) = imagined, reference
    if i_lo <= r_hi and r_lo <= i_hi:
        return None
    return (
        f"imagination {i_value:.0%} (95% CI {i_lo:.0%}-{i_hi:.0%}) vs {reference_name} "
        f"{r_value:.0%} (95% CI {r_lo:.0%}-{r_hi:.0%}): the intervals do not overlap"
    )
