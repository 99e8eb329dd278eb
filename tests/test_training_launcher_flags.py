"""accelerate launch's --gradient_accumulation_steps and --mixed_precision reach the loop through the
environment: a different accumulation is rejected (it would skip optimiser steps the loop counts), a
different precision is reported as ignored, each naming the --train.* option to use."""

from __future__ import annotations

import logging

import pytest
from test_training_loop import LinearData, Recorder, cfg, save_fn
from torch import nn

from worldloop.common.checkpoint import load_torch
from worldloop.common.training import check_launcher_flags, cpu_bf16_note, run_training

ACCUM = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
PRECISION = "ACCELERATE_MIXED_PRECISION"


def test_flags_are_checked_against_the_train_options():
    assert check_launcher_flags(cfg(grad_accum=2), {ACCUM: "2", PRECISION: "no"}) is None
    assert check_launcher_flags(cfg(), {}) is None
    with pytest.raises(ValueError, match=r"'4'.*differs from train.grad_accum=1.*--train.grad_accum=4"):
        check_launcher_flags(cfg(), {ACCUM: "4"})
    note = check_launcher_flags(cfg(mixed_precision="bf16"), {PRECISION: "FP16"})
    assert "'fp16'" in note and "is ignored" in note and "--train.mixed_precision=fp16" in note


def _optimiser_steps(output_dir) -> list[int]:
    state = load_torch(output_dir / "checkpoints" / "0000008" / "training_state" / "optimizer.pt")["state"]
    return sorted({int(s["step"]) for s in state.values()})


def test_an_accumulation_flag_that_would_skip_steps_stops_the_run_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv(ACCUM, "4")
    rec = Recorder()
    with pytest.raises(ValueError, match="--train.grad_accum=4"):
        run_training(nn.Linear(4, 1), LinearData(), rec, cfg(), tmp_path / "a", save_fn)
    assert rec.losses == [] and not (tmp_path / "a" / "checkpoints").exists()


def test_a_matching_flag_keeps_one_optimiser_step_per_loop_step(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(ACCUM, "2")
    monkeypatch.setenv(PRECISION, "fp16")
    rec = Recorder()
    with caplog.at_level(logging.WARNING, logger="worldloop.common.training"):
        run_training(nn.Linear(4, 1), LinearData(), rec, cfg(grad_accum=2), tmp_path / "b", save_fn)
    assert len(rec.losses) == 16 and _optimiser_steps(tmp_path / "b") == [8]
    assert any("--train.mixed_precision=fp16" in r.getMessage() for r in caplog.records)


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of():
    assert "emulated" in cpu_bf16_note(cfg(mixed_precision="bf16"), "cpu", ["avx2"])
    assert cpu_bf16_note(cfg(mixed_precision="bf16"), "cpu", ["avx2", "avx512f", "avx512_bf16"]) is None
    assert cpu_bf16_note(cfg(mixed_precision="bf16"), "cpu", None) is None  # unknown: no claim
    assert cpu_bf16_note(cfg(), "cpu", ["avx2"]) is None
    assert cpu_bf16_note(cfg(mixed_precision="bf16"), "cuda", ["avx2"]) is None  # a GPU trains
