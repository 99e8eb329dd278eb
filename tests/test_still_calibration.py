"""Still pixels copied from the frame before, and the threshold that decides which pixels stand still."""

from __future__ import annotations

import json

import pytest
import torch

from worldloop.data.dataset import DatasetConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiTConfig
from worldloop.world_model.metrics import HeldOutWindows
from worldloop.world_model.model import WorldModel, keep_still_pixels
from worldloop.world_model.sampler import SamplerConfig
from worldloop.world_model.still_calibration import calibrate_still_threshold


def _tiny_model(still_threshold: float = 0.0) -> WorldModel:
    torch.manual_seed(0)
    dit = VideoDiTConfig(image_size=16, patch_size=4, width=32, depth=1, heads=2, context_frames=2)
    return WorldModel(
        WorldModelConfig(dit=dit, sampler=SamplerConfig(still_threshold=still_threshold))
    ).eval()


def test_still_pixels_are_copied_and_a_mover_keeps_its_edge():
    previous = torch.zeros(1, 3, 8, 8)
    drawn = previous + 0.04 * torch.randn(1, 3, 8, 8).clamp(-1, 1)  # drift below the threshold everywhere
    drawn[0, 1, 4, 4] = 0.9  # one pixel moved, in one channel
    drawn.requires_grad_(True)
    out = keep_still_pixels(drawn, previous, 0.05)
    near = torch.zeros(8, 8, dtype=torch.bool)
    near[3:6, 3:6] = True  # the moved pixel grown by one each way
    assert torch.equal(out[0][:, near], drawn[0][:, near].detach())
    assert torch.equal(out[0][:, ~near], previous[0][:, ~near])
    out.sum().backward()
    assert torch.equal(drawn.grad[0, 0] != 0, near)  # gradient only through the pixels that were drawn


def test_a_negative_still_threshold_is_refused():
    with pytest.raises(ValueError, match="still_threshold"):
        SamplerConfig(still_threshold=-0.1).validate()


def test_rollout_copies_the_last_frame_where_the_model_changes_little():
    ctx = torch.rand(2, 2, 3, 16, 16)
    actions = torch.randn(2, 1, 4), torch.randn(2, 3, 4)
    drawn = _tiny_model(0.0).rollout(ctx, *actions, generator=torch.Generator().manual_seed(1))[0]
    assert not torch.allclose(drawn[:, 0], ctx[:, -1], atol=1e-3)
    # a threshold above the largest possible change (pixels in [-1, 1]) copies every pixel: copy-last-frame
    frozen = _tiny_model(2.5).rollout(ctx, *actions, generator=torch.Generator().manual_seed(1))[0]
    assert torch.allclose(frozen, ctx[:, -1:].expand_as(frozen), atol=1e-6)


def _still_windows(n: int = 3, frames: int = 5) -> HeldOutWindows:
    scene = torch.rand(n, 1, 3, 16, 16).expand(n, frames, 3, 16, 16).contiguous()
    return HeldOutWindows(
        frames=scene,
        actions=torch.zeros(n, frames, 4),
        reward=torch.zeros(n, frames),
        success=torch.zeros(n, frames),
    )


@pytest.mark.parametrize(
    "device",
    # The windows stay on the CPU while a trained model sits on the GPU (the end of a GPU training run).
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))],
)
def test_calibration_picks_the_threshold_with_the_best_ssim_and_restores_the_sampler(device):
    model = _tiny_model(0.0).to(device)
    report = calibrate_still_threshold(model, _still_windows(), context=2, candidates=(0.0, 0.05, 2.5))
    # nothing moves in these windows: copying every pixel (2.5) is exact, the random model is not
    assert report["threshold"] == 2.5
    by = {r["threshold"]: r for r in report["candidates"]}
    assert by[2.5]["mean_ssim"] == pytest.approx(1.0, abs=1e-4)
    assert by[0.0]["mean_ssim"] < by[2.5]["mean_ssim"]
    assert report["copy_last"]["mean_ssim"] == pytest.approx(1.0, abs=1e-4)
    assert report["horizon"] == 3 and report["windows"] == 3 and len(by[0.0]["ssim"]) == 3
    assert model.cfg.sampler.still_threshold == 0.0
    with pytest.raises(ValueError, match="at least one candidate"):
        calibrate_still_threshold(model, _still_windows(), context=2, candidates=())


def test_calibrate_only_writes_the_still_threshold_into_the_checkpoint(tiny_lerobot_dataset, tmp_path):
    from worldloop.world_model import trainer

    root = tiny_lerobot_dataset(tmp_path, episodes=4, length=8, cameras=("front",))
    _tiny_model().save_pretrained(tmp_path / "model")
    cfg = trainer.TrainWorldModelConfig(
        dataset=DatasetConfig(root=str(root), held_out_fraction=0.25),
        init_from=str(tmp_path / "model"),
        calibrate_only=True,
        calibrate_success=False,
        eval=trainer.EvalConfig(context=2, horizon=4, stride=2),
        still_windows=4,
        output_dir=str(tmp_path / "out"),
    )
    trainer.train(cfg)
    report = json.loads((tmp_path / "out" / "eval" / "still_calibration.json").read_text())
    saved = WorldModel.from_pretrained(tmp_path / "out" / "pretrained_model")
    assert saved.cfg.sampler.still_threshold == report["threshold"]
    assert report["windows"] == 4 and report["horizon"] == 4
