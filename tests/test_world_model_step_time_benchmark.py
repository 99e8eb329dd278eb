"""benchmarks/world_model_step_time.py on a tiny push recording: both phases timed, the recipe summed."""

from __future__ import annotations

import pytest
import torch
from conftest import record_tiny_push

from benchmarks.world_model_step_time import (
    StepTimeBenchmarkConfig,
    phase_config,
    run_benchmark,
    step_autocast,
)
from worldloop.data.dataset import DatasetConfig


def test_step_time_benchmark_times_both_phases_and_sums_the_recipe(tmp_path):
    root = record_tiny_push(tmp_path / "push", episodes=3, image_size=64, max_steps=12)
    cfg = StepTimeBenchmarkConfig(
        dataset=DatasetConfig(root=str(root)), steps=1, warmup=0, self_rollout_steps=10
    )
    figures = run_benchmark(cfg)
    first, second = figures["phases"]["teacher_forced"], figures["phases"]["self_rollout"]
    assert (first["window"], second["window"]) == (5, 8)  # tiny.yaml's, then the recipe's second phase
    assert first["recipe_steps"] == 6400 and second["recipe_steps"] == 10
    for phase in (first, second):
        parts = sum(phase[k] for k in ("data_ms", "forward_ms", "backward_ms", "optimiser_ms"))
        assert phase["step_ms"] == pytest.approx(parts) and phase["forward_ms"] > 0
    minutes = figures["recipe_minutes"]
    assert minutes["teacher_forced"] == pytest.approx(first["step_ms"] * 6400 / 60_000)
    assert minutes["total"] == pytest.approx(minutes["teacher_forced"] + minutes["self_rollout"])


def test_step_time_benchmark_needs_a_dataset():
    with pytest.raises(ValueError, match="dataset.root"):
        run_benchmark(StepTimeBenchmarkConfig())


def test_bf16_times_the_forward_under_bf16_autocast_and_fp32_does_not(tmp_path):
    root = record_tiny_push(tmp_path / "push", episodes=3, image_size=64, max_steps=12)
    for precision, dtype in (("no", torch.float32), ("bf16", torch.bfloat16)):
        cfg = StepTimeBenchmarkConfig(dataset=DatasetConfig(root=str(root)), mixed_precision=precision)
        train = phase_config(cfg, ())
        assert train.train.mixed_precision == precision
        with step_autocast(train):
            assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == dtype
    figures = run_benchmark(
        StepTimeBenchmarkConfig(
            dataset=DatasetConfig(root=str(root)),
            steps=1,
            warmup=0,
            self_rollout_steps=10,
            mixed_precision="bf16",
        )
    )
    assert figures["mixed_precision"] == "bf16" and figures["phases"]["self_rollout"]["step_ms"] > 0


def test_step_time_benchmark_refuses_fp16_by_name():
    with pytest.raises(ValueError, match="mixed_precision='fp16'"):
        run_benchmark(StepTimeBenchmarkConfig(dataset=DatasetConfig(root="x"), mixed_precision="fp16"))
