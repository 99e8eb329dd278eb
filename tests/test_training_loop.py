"""The shared training loop: loss goes down, checkpoints are atomic and complete, resume is exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from worldloop.common.checkpoint import load_tensors, save_tensors
from worldloop.common.training import EpochBatches, TrainLoopConfig, last_checkpoint, run_training


class LinearData(Dataset):
    def __init__(self, n: int = 64):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "y": self.y[i]}


class Recorder:
    """A loss with injected noise (so the RNG state matters), which can crash at a given call."""

    def __init__(self, crash_at: int | None = None):
        self.losses: list[float] = []
        self.crash_at = crash_at

    def __call__(self, model, batch):
        if self.crash_at is not None and len(self.losses) == self.crash_at:
            raise KeyboardInterrupt("simulated interruption")
        noisy = batch["x"] + 0.01 * torch.randn_like(batch["x"])
        loss = ((model(noisy).squeeze(-1) - batch["y"]) ** 2).mean()
        self.losses.append(loss.item())
        return loss, {}


def save_fn(model, path):
    path.mkdir(parents=True, exist_ok=True)
    save_tensors(model.state_dict(), path / "model.safetensors")


def cfg(**kw) -> TrainLoopConfig:
    base = dict(steps=8, batch_size=8, lr=0.05, warmup_steps=2, checkpoint_every=4, report_to="none")
    return TrainLoopConfig(**{**base, **kw})


def test_loss_decreases_and_final_export(tmp_path):
    torch.manual_seed(0)
    rec = Recorder()
    run_training(nn.Linear(4, 1), LinearData(), rec, cfg(steps=60, checkpoint_every=30), tmp_path, save_fn)
    assert sum(rec.losses[-5:]) < 0.2 * sum(rec.losses[:5])
    assert (tmp_path / "pretrained_model" / "model.safetensors").is_file()
    assert last_checkpoint(tmp_path).name == "0000060"


def test_resume_is_exact(tmp_path):
    torch.manual_seed(0)
    full = Recorder()
    run_training(nn.Linear(4, 1), LinearData(), full, cfg(), tmp_path / "a", save_fn)

    torch.manual_seed(0)
    crashed = Recorder(crash_at=6)  # dies during step 7, after the checkpoint at step 4
    with pytest.raises(KeyboardInterrupt):
        run_training(nn.Linear(4, 1), LinearData(), crashed, cfg(), tmp_path / "b", save_fn)
    assert last_checkpoint(tmp_path / "b").name == "0000004"

    torch.manual_seed(123)  # resume must not depend on the caller's RNG or fresh weights
    resumed = Recorder()
    model = run_training(nn.Linear(4, 1), LinearData(), resumed, cfg(), tmp_path / "b", save_fn, resume=True)
    assert resumed.losses == full.losses[4:]
    final_a = load_tensors(tmp_path / "a" / "pretrained_model" / "model.safetensors")
    for k, v in model.state_dict().items():
        assert torch.equal(v, final_a[k])


@pytest.mark.parametrize(
    ("keep", "kept"), [(2, ["0000006", "0000008"]), (0, ["0000002", "0000004", "0000006", "0000008"])]
)
def test_keep_checkpoints_keeps_the_newest_or_every_one(tmp_path, keep, kept):
    run_training(
        nn.Linear(4, 1),
        LinearData(),
        Recorder(),
        cfg(checkpoint_every=2, keep_checkpoints=keep),
        tmp_path,
        save_fn,
    )
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.is_dir()) == kept
    with pytest.raises(ValueError, match="train.keep_checkpoints"):
        run_training(nn.Linear(4, 1), LinearData(), Recorder(), cfg(keep_checkpoints=-1), tmp_path, save_fn)


def test_resume_without_checkpoint_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run_training(nn.Linear(4, 1), LinearData(), Recorder(), cfg(), tmp_path, save_fn, resume=True)


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="train.batch_size"):
        run_training(nn.Linear(4, 1), LinearData(), Recorder(), cfg(batch_size=0), "unused", save_fn)


def test_epoch_batches_split_ranks_without_overlap():
    per_rank = [EpochBatches(50, 4, seed=1, rank=r, world_size=2).epoch(3) for r in range(2)]
    flat = [sorted(i for b in batches for i in b) for batches in per_rank]
    assert len(flat[0]) == len(flat[1]) == 24
    assert not set(flat[0]) & set(flat[1])
    assert EpochBatches(50, 4, seed=1, rank=0, world_size=2).epoch(3, start_batch=2) == per_rank[0][2:]


class PeekThenFit(nn.Module):
    """A forward that first runs its layer without a graph (as the world model's context and self-rollout
    passes do), then with one."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x):
        with torch.no_grad():
            self.lin(x)
        return self.lin(x)


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps one process-wide state whose precision is fixed by the first Accelerator: a bf16 run
    among fp32 ones needs it cleared before, and after for the tests that follow."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_bf16_trains_weights_that_a_no_grad_pass_used_first(tmp_path, fresh_accelerate_state):
    # Autocast's weight cache would hand the second pass the first pass's graphless bf16 copy: the loss would
    # still be computed, and the weight would never move.
    torch.manual_seed(0)
    model = PeekThenFit()
    start = model.lin.weight.detach().clone()
    rec = Recorder()
    run_training(
        model,
        LinearData(),
        rec,
        cfg(steps=60, checkpoint_every=30, ema_decay=0.0, mixed_precision="bf16"),
        tmp_path,
        save_fn,
    )
    assert not torch.equal(model.lin.weight.detach(), start)
    assert sum(rec.losses[-5:]) < 0.2 * sum(rec.losses[:5])
