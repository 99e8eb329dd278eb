"""Ranking metrics (Pearson, Spearman, MMRV) on hand-computed inputs and against scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldloop.rl_finetune.imagination.ranking import (
    average_ranks,
    mmrv,
    pearson,
    ranking_report,
    spearman,
)


def test_same_order_is_perfect():
    proxy, ref = [0.1, 0.2, 0.3], [0.2, 0.4, 0.6]
    assert pearson(proxy, ref) == pytest.approx(1.0)
    assert spearman(proxy, ref) == pytest.approx(1.0)
    assert mmrv(proxy, ref) == 0.0


def test_reversed_order():
    proxy, ref = [0.3, 0.2, 0.1], [0.2, 0.4, 0.6]
    assert spearman(proxy, ref) == pytest.approx(-1.0)
    # policy 0: worst violation against policy 2 (0.4); policy 1: 0.2; policy 2: 0.4
    assert mmrv(proxy, ref) == pytest.approx((0.4 + 0.2 + 0.4) / 3)


def test_one_swap_costs_the_reference_gap_of_the_swapped_pair():
    proxy, ref = [0.1, 0.95, 0.9], [0.1, 0.5, 0.9]
    assert mmrv(proxy, ref) == pytest.approx(2 * 0.4 / 3)
    assert spearman(proxy, ref) == pytest.approx(0.5)  # 1 - 6 * 2 / (3 * 8)
    near = [0.1, 0.52, 0.5]  # swapping two near-equal policies is cheap
    assert mmrv(near, [0.1, 0.5, 0.51]) == pytest.approx(2 * 0.01 / 3)


def test_pearson_by_hand():
    assert pearson([1, 2, 3, 4], [2, 1, 4, 3]) == pytest.approx(0.6)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))


def test_ties_share_average_ranks():
    assert average_ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]


def test_bad_inputs_are_errors():
    with pytest.raises(ValueError, match="equal length"):
        mmrv([0.1, 0.2], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="at least 2"):
        spearman([0.1], [0.2])
    with pytest.raises(ValueError, match="finite"):
        pearson([0.1, float("nan")], [0.2, 0.3])


def test_report_gaps():
    report = ranking_report([0.2, 0.5, 0.9], [0.1, 0.6, 0.9])
    assert report["max_abs_gap"] == pytest.approx(0.1)
    assert report["mean_abs_gap"] == pytest.approx(0.2 / 3)


rates = st.lists(st.integers(0, 20).map(lambda k: k / 20), min_size=3, max_size=9)


def _brute_ranks(v):
    return [1 + sum(w < x for w in v) + (sum(w == x for w in v) - 1) / 2 for x in v]


@settings(max_examples=60, deadline=None)
@given(rates, st.randoms(use_true_random=False))
def test_matches_independent_formulas_and_mmrv_bounds(ref, rnd):
    proxy = [min(1.0, max(0.0, r + rnd.uniform(-0.3, 0.3))) for r in ref]
    assert average_ranks(proxy).tolist() == _brute_ranks(proxy)
    if len(set(ref)) > 1 and len(set(proxy)) > 1:
        assert pearson(proxy, ref) == pytest.approx(np.corrcoef(proxy, ref)[0, 1], abs=1e-9)
        expected = np.corrcoef(_brute_ranks(proxy), _brute_ranks(ref))[0, 1]
        assert spearman(proxy, ref) == pytest.approx(expected, abs=1e-9)
    m = mmrv(proxy, ref)
    assert 0.0 <= m <= max(ref) - min(ref) + 1e-12
    assert mmrv(ref, ref) == 0.0
    assert mmrv(np.array(ref) * 0.5 + 0.1, ref) == 0.0  # any increasing map keeps the order


def test_threshold_sweep_judges_the_same_episodes_at_each_lower_threshold():
    from worldloop.rl_finetune.imagination.policy_ranking import threshold_sweep

    def record(max_probs, sim):
        return {
            "imagination": {"per_episode": [{"max_success_prob": p} for p in max_probs]},
            "sim": {"success_rate": sim},
        }

    # weak: near misses at 0.6-0.8; strong: clear successes; the sim says 0% and 100%
    records = {"weak": record([0.62, 0.78, 0.3, 0.1], 0.0), "strong": record([0.97, 0.99, 0.93, 0.2], 0.75)}
    sweep = threshold_sweep(records, run_threshold=0.9)
    assert [row["threshold"] for row in sweep] == [0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9]
    by_threshold = {row["threshold"]: row for row in sweep}
    assert by_threshold[0.5]["imagined"] == [0.5, 0.75] and by_threshold[0.5]["max_abs_gap"] == 0.5
    assert by_threshold[0.7]["imagined"] == [0.25, 0.75]
    assert by_threshold[0.8]["imagined"] == [0.0, 0.75] and by_threshold[0.8]["max_abs_gap"] == 0.0
    assert threshold_sweep(records, run_threshold=0.6)[-1]["threshold"] == 0.6  # nothing above the run's
