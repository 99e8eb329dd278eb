"""Confidence intervals on inputs whose answers are known."""

import math

import numpy as np
import pytest

from worldloop.common.stats import (
    auroc,
    auroc_ci,
    bootstrap_ci,
    cluster_bootstrap_ci,
    mean_ci,
    student_t_quantile,
    wilson_interval,
    within_group_auroc,
)
from worldloop.rl_finetune.imagination.ranking import ranking_cis


def test_wilson_interval():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.25 < hi < 0.35  # Wald would give [0, 0]
    lo, hi = wilson_interval(5, 10)
    assert lo < 0.5 < hi and abs((lo + hi) / 2 - 0.5) < 1e-9
    narrow = wilson_interval(50, 100)
    assert narrow[1] - narrow[0] < hi - lo
    with pytest.raises(ValueError, match="n > 0"):
        wilson_interval(0, 0)


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (30, 2.0423)])
def test_student_t_quantile_matches_tables(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=2e-4)


def test_mean_ci_three_seeds():
    ci = mean_ci([1.0, 2.0, 3.0])
    assert ci["mean"] == 2.0 and ci["std"] == pytest.approx(1.0) and ci["n"] == 3
    half = 4.3027 / math.sqrt(3)
    assert ci["low"] == pytest.approx(2 - half, abs=1e-3) and ci["high"] == pytest.approx(2 + half, abs=1e-3)
    one = mean_ci([5.0])
    assert one["mean"] == 5.0 and one["low"] == -math.inf and one["high"] == math.inf
    with pytest.raises(ValueError, match="finite"):
        mean_ci([1.0, float("nan")])


def test_bootstrap_ci_of_a_proportion():
    # 400 fair coin flips: the mean's 95% interval is about 0.5 +- 1.96 * 0.025.
    flips = np.array([0.0, 1.0] * 200)
    ci = bootstrap_ci(lambda gs: gs[0].mean(), [flips], n_boot=2000, seed=0)
    assert ci["value"] == 0.5 and ci["undefined"] == 0
    assert ci["low"] == pytest.approx(0.451, abs=0.012) and ci["high"] == pytest.approx(0.549, abs=0.012)
    # Reproducible with the seed, different with another.
    assert bootstrap_ci(lambda gs: gs[0].mean(), [flips], n_boot=200, seed=3) == bootstrap_ci(
        lambda gs: gs[0].mean(), [flips], n_boot=200, seed=3
    )
    assert bootstrap_ci(lambda gs: gs[0].mean(), [flips], n_boot=200, seed=3) != bootstrap_ci(
        lambda gs: gs[0].mean(), [flips], n_boot=200, seed=4
    )


def test_ranking_cis_known_orders():
    # Four policies at 0%, 30%, 60%, 90% in both evaluations, 50 episodes each: resampling cannot swap them
    # often, so Spearman's interval sits near 1 and MMRV's near 0.
    rates = [0.0, 0.3, 0.6, 0.9]
    outcomes = [np.array([1.0] * int(r * 50) + [0.0] * (50 - int(r * 50))) for r in rates]
    cis = ranking_cis(outcomes, outcomes, n_boot=300, seed=0)
    assert cis["spearman"]["value"] == pytest.approx(1.0) and cis["spearman"]["low"] > 0.7
    assert cis["pearson"]["low"] > 0.9
    assert cis["mmrv"]["value"] == 0.0 and cis["mmrv"]["high"] < 0.2
    # The proxy reverses the order: the figures are the opposite, and so are their intervals.
    reversed_cis = ranking_cis(outcomes[::-1], outcomes, n_boot=300, seed=0)
    assert reversed_cis["spearman"]["high"] < -0.7 and reversed_cis["mmrv"]["low"] > 0.3
    # A policy at 0% on both sides of a 2-policy ranking: every resample is constant -> undefined, counted.
    flat = ranking_cis([np.zeros(5), np.zeros(5)], [np.zeros(5), np.ones(5)], n_boot=50)
    assert flat["pearson"]["undefined"] == 50 and math.isnan(flat["pearson"]["low"])
    with pytest.raises(ValueError, match="policies"):
        ranking_cis(outcomes, outcomes[:3])


def test_auroc_by_hand():
    assert auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.2, 0.9, 0.8], [True, True, False, False]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.9, 0.3, 0.5, 0.2], [True, False, True, False]) == 1.0
    assert auroc([0.9, 0.6, 0.5, 0.7], [True, False, True, False]) == 0.5  # 0.9 beats both, 0.5 beats none
    assert math.isnan(auroc([0.1, 0.2], [True, True]))


def test_auroc_ci_resamples_within_each_class():
    rng = np.random.default_rng(0)
    scores = np.r_[rng.normal(1.0, 1.0, 60), rng.normal(0.0, 1.0, 60)]
    labels = np.r_[np.ones(60, bool), np.zeros(60, bool)]
    ci = auroc_ci(scores, labels, n_boot=500)
    assert ci["value"] == auroc(scores, labels) and ci["low"] < ci["value"] < ci["high"]
    assert ci["undefined"] == 0  # no resample lost a class
    separated = auroc_ci(np.r_[np.ones(5), np.zeros(5)], labels[55:65], n_boot=200)
    assert separated["low"] == separated["high"] == 1.0
    assert auroc_ci([0.2, 0.9], [True, True]) is None
    with pytest.raises(ValueError, match="equal length"):
        auroc_ci([0.1, 0.2], [True])


def test_within_group_auroc_counts_only_pairs_of_one_group():
    # Group 0 is easy (both succeed, high scores), group 1 hard (both fail, low scores): pooled, the score
    # looks perfect; within a group there is nothing to compare.
    scores, labels, groups = [0.9, 0.8, 0.2, 0.1], [True, True, False, False], [0, 0, 1, 1]
    assert auroc(scores, labels) == 1.0
    unmixed = within_group_auroc(scores, labels, groups)
    assert math.isnan(unmixed["value"]) and unmixed["pairs"] == 0 and unmixed["mixed_groups"] == 0
    # Within each group the failure scores higher: 0, where pooling reads 0.25 (0.9 above 0.2).
    scores, labels, groups = [0.9, 0.95, 0.1, 0.2], [True, False, True, False], [0, 0, 1, 1]
    assert auroc(scores, labels) == 0.25
    assert within_group_auroc(scores, labels, groups) == {"value": 0.0, "pairs": 2, "mixed_groups": 2}
    # Ties count a half; a group of 1 success and 2 failures gives 2 pairs.
    assert within_group_auroc([0.5, 0.5, 0.1], [True, False, False], [3, 3, 3])["value"] == 0.75
    with pytest.raises(ValueError, match="equal length"):
        within_group_auroc([0.1, 0.2], [True, False], [0])


def test_cluster_bootstrap_resamples_whole_clusters():
    clusters = [np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.array([1.0, 0.0])]
    seen = []

    def mean_of(index):
        seen.append(index.copy())
        return float(np.mean(np.concatenate([clusters[i] for i in index])))

    ci = cluster_bootstrap_ci(mean_of, 3, n_boot=300)
    assert ci["value"] == 0.5 and 0.0 <= ci["low"] < 0.5 < ci["high"] <= 1.0
    assert np.array_equal(seen[-1], [0, 1, 2])  # the point value is the statistic on every cluster once
    assert all(len(i) == 3 and set(i) <= {0, 1, 2} for i in seen)
    assert ci["n_boot"] == 300 and ci["undefined"] == 0
    assert cluster_bootstrap_ci(lambda index: math.nan, 2, n_boot=5)["undefined"] == 5
