"""benchmarks/wm_posttrain.py: the before-vs-after comparison on known inputs, and end to end on a tiny model."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_lerobot_dataset
from test_posttrain_objective import tiny_world_model

from benchmarks.wm_posttrain import WMPosttrainBenchmarkConfig, compare, run_benchmark
from worldloop.common.config import ConfigError
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.dataset import DatasetConfig
from worldloop.rl_finetune.wm_posttrain.rollout_stability import FidelityRewardConfig


def _result(scores: list[float], ssim_at_1: float, decoded: torch.Tensor) -> dict[str, torch.Tensor]:
    n, horizon = len(scores), decoded.shape[1]
    ssim = torch.full((n, horizon), 0.5)
    ssim[:, 0] = ssim_at_1
    commanded = torch.zeros(n, horizon, 4)
    return {
        "ssim": ssim,
        "psnr": torch.full((n, horizon), 20.0),
        "score": torch.tensor(scores)[:, None].expand(n, horizon).clone(),
        "decoded": decoded,
        "decoded_real": commanded.clone(),
        "commanded": commanded,
    }


def test_compare_on_known_inputs():
    horizon = 10
    smooth = torch.zeros(4, horizon, 4)
    jerky = smooth.clone()
    jerky[:, ::2] = 0.05  # alternating steps: large jerk, within every limit
    before = _result([0.5, 0.5, 0.5, 0.5], 0.90, jerky)
    after = _result([0.6, 0.7, 0.5, 0.4], 0.89, smooth)  # wins 2, ties 1, loses 1
    out = compare({"before": before, "after": after}, TABLETOP_ARM, horizon)
    assert out["change"]["paired_win_rate"] == pytest.approx((2 + 0.5) / 4)
    assert out["change"]["ssim@1_delta"] == pytest.approx(-0.01)
    assert out["targets_met"]["horizon1_ssim_drop_at_most_0.005"] is False
    assert out["after"]["jerk_rms"] == 0 < out["before"]["jerk_rms"]
    assert out["change"]["jerk_rms_relative"] == pytest.approx(-1.0)
    assert out["targets_met"]["jerk_down_20pct"] is True
    assert "ssim@10" in out["before"] and "ssim@20" not in out["before"]
    assert out["change"]["ssim@10_relative"] == 0
    # The IDM's reading of the real frames is the floor, computed from `decoded_real`.
    assert out["idm_on_real_frames"]["jerk_rms"] == 0


@pytest.fixture(scope="module")
def models_and_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wm_bench")
    root = make_tiny_lerobot_dataset(tmp / "dataset", episodes=6, length=20, image_size=(16, 16))
    tiny_world_model(0).save_pretrained(tmp / "a")
    tiny_world_model(1).save_pretrained(tmp / "b")
    return root, tmp / "a", tmp / "b"


def _cfg(root, before, after, **kw) -> WMPosttrainBenchmarkConfig:
    return WMPosttrainBenchmarkConfig(
        before=str(before),
        after=str(after),
        dataset=DatasetConfig(root=str(root), held_out_fraction=0.5),
        horizon=10,
        start_states=4,
        batch_size=4,
        candidates=2,
        fidelity=FidelityRewardConfig(ssim_window=7),
        **kw,
    )


def test_a_model_against_itself_ties_everywhere(models_and_data):
    root, a, _ = models_and_data
    figures = run_benchmark(_cfg(root, a, a))
    assert figures["before"] == figures["after"]
    assert figures["change"]["paired_win_rate"] == 0.5
    assert figures["change"]["ssim@1_delta"] == 0
    assert figures["targets_met"]["horizon1_ssim_drop_at_most_0.005"] is True
    assert figures["targets_met"]["win_rate_at_least_75pct"] is False
    assert figures["candidates"]["group_size"] == 2 and figures["candidates"]["clip_reward_group_std"] >= 0


def test_two_models_and_a_wrong_embodiment(models_and_data):
    root, a, b = models_and_data
    figures = run_benchmark(_cfg(root, a, b))
    assert figures["before"] != figures["after"]
    assert 0 <= figures["change"]["paired_win_rate"] <= 1
    with pytest.raises(ConfigError, match="embodiment"):
        run_benchmark(_cfg(root, a, b, embodiment="so101_follower"))
