"""benchmarks/kernels.py in its smoke mode (small shapes, the PyTorch paths): it runs on a CPU, records what it
measured, skips the GPU-only rows with a reason, and writes its JSON where it is told (never over the
committed GPU result)."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
import yaml

from benchmarks.kernels import moving_squares, speedups, target_checks
from worldloop.world_model.recipe import TEACHER_FORCING_PHASE_ARGS

ROOT = Path(__file__).resolve().parents[1]


def _smoke(tmp_path: Path, sections: str) -> dict:
    out = tmp_path / "kernels_smoke.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/kernels.py", "--smoke=true", f"--sections={sections}", f"--out={out}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["benchmark"] == "kernels" and "--smoke=true" in record["command"]
    return record["figures"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke mode; a GPU runs the full benchmark")
def test_smoke_measures_the_torch_paths_and_skips_the_gpu_rows(tmp_path):
    figures = _smoke(tmp_path, "[attention,decode,elementwise,imagine]")
    assert figures["mode"] == "smoke" and figures["device"] == "cpu" and figures["torch"] == torch.__version__
    assert {"attention", "decode", "adaln", "latent"} <= set(figures["shapes"])
    for section in ("attention", "decode"):
        by_method = {r["method"]: r for r in figures[section]}
        assert by_method["sdpa_dense_mask"]["fwd_ms"] > 0 and by_method["flex_eager"]["fwd_ms"] > 0
        assert by_method["ours_triton"]["fwd_ms"] is None
        assert by_method["ours_triton"]["error"].startswith("skipped: needs CUDA")
    assert all(r["fwd_bwd_ms"] > 0 for r in figures["attention"] if r["method"] != "ours_triton")
    eager = [r for r in figures["elementwise"] if r["method"] == "eager"]
    assert len(eager) == 3 and all(r["fwd_ms"] > 0 for r in eager)
    assert {(r["backend"], r["batch"]) for r in figures["imagine"]} == {
        ("auto", 1),
        ("auto", 2),
        ("sdpa", 1),
        ("sdpa", 2),
    }
    assert all(r["frames_per_s"] > 0 for r in figures["imagine"])
    assert figures["speedups"] == []  # nothing of ours ran: no ratio is made up
    assert [t["met"] for t in figures["targets"]] == [None] * 4  # a smoke run judges no target
    assert "train" not in figures


@pytest.mark.slow
def test_smoke_trains_through_the_shared_loop(tmp_path):
    figures = _smoke(tmp_path, "[train,train_run]")
    rows = {r["backend"]: r for r in figures["train"]}
    assert rows["sdpa"]["steps_per_s"] > 0 and rows["flex"]["steps_per_s"] > 0
    assert rows["triton"]["error"].startswith("skipped")
    (run,) = figures["train_run"]
    assert run["steps"] == 3 and run["exported"] == ["config.yaml", "model.safetensors", "stats.json"]
    assert run["diffusion_loss_first_tenth"] > 0


def test_generated_squares_move_with_the_actions():
    data = moving_squares(n=3, window=4, num_views=2, size=32, action_dim=4, seed=0)
    frames, actions = data["frames"], data["actions"]
    assert frames.shape == (3, 4, 2, 3, 32, 32) and frames.dtype == torch.uint8 and actions.shape == (3, 4, 4)
    lit = frames[:, :, 0, 0] > 0  # view 0, one channel: where the square is
    rows = torch.arange(32.0)
    centre_y = (lit.any(-1).float() * rows).sum(-1) / lit.any(-1).sum(-1)
    moved = centre_y[:, 1:] - centre_y[:, :-1]
    # the square moves along the first action component (where it is off the border and the step is > 1 px)
    free = (centre_y[:, 1:] > 5) & (centre_y[:, 1:] < 26) & (actions[:, :-1, 0].abs() > 0.5)
    assert free.any()
    assert (torch.sign(moved[free]) == torch.sign(actions[:, :-1, 0][free])).all()
    assert torch.equal(frames[:, :, 1], frames[:, :, 0].flip(-1))  # view 1 mirrors view 0


@pytest.mark.slow
def test_gpu_session_script_runs_its_stages_at_small_shapes(tmp_path):
    """benchmarks/gpu_session.sh as a GPU session runs it, with SMOKE=1 on this machine: the GPU tests are
    collected (and skip without CUDA), the training run writes its JSON; an unknown stage fails."""
    env = {**os.environ, "SMOKE": "1", "OUT": str(tmp_path), "PYTHON": sys.executable}
    script = ["bash", "benchmarks/gpu_session.sh"]
    proc = subprocess.run(
        [*script, "tests", "train"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped" in (tmp_path / "pytest_gpu.log").read_text()
    (run,) = json.loads((tmp_path / "kernels_train_run.json").read_text())["figures"]["train_run"]
    assert run["steps"] == 3
    bad = subprocess.run([*script, "bogus"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "unknown stage 'bogus'" in bad.stdout


@pytest.mark.slow
def test_gpu_session_world_model_stage_trains_the_push_recipe_and_packs_it(tmp_path):
    """The `world_model` stage with SMOKE=1: both phases of the push recipe (the second from the first's
    weights) train 2 steps on a recorded push dataset, and both phases' models come back as tars in $OUT;
    without a dataset it stops naming WM_DATA."""
    from conftest import record_tiny_push

    data = record_tiny_push(tmp_path / "push", episodes=2, image_size=64, max_steps=10)
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "OUT": str(out), "PYTHON": sys.executable, "WM_DATA": str(data)}
    env |= {"WM_SEED": "3", "WM_OUTPUT_DIR": str(tmp_path / "runs"), "WM_ARGS": "--train.batch_size=2"}
    # overrides the recipe's 8, 4 and 4
    env |= {"WM_SR_ARGS": "--window=5 --model.self_rollout_frames=3 --model.self_rollout_grad_frames=3"}
    script = ["bash", "benchmarks/gpu_session.sh", "world_model"]
    proc = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(out / "world_model_s3_tf.tar") as tar:
        assert yaml.safe_load(tar.extractfile("pretrained_model/config.yaml"))["self_rollout_frames"] == 0
        first = json.load(tar.extractfile("pretrained_model/training.json"))["command"].split()
    assert set(TEACHER_FORCING_PHASE_ARGS) <= set(first)  # the recipe's first-phase overrides
    assert first.index("--train.batch_size=2") > max(first.index(a) for a in TEACHER_FORCING_PHASE_ARGS)
    with tarfile.open(out / "world_model_s3.tar") as tar:
        assert {"pretrained_model/model.safetensors", "pretrained_model/config.yaml"} <= set(tar.getnames())
        second = yaml.safe_load(tar.extractfile("pretrained_model/config.yaml"))
    assert second["self_rollout_frames"] == 3  # the second phase's model, with WM_SR_ARGS after the recipe's
    env["WM_DATA"] = str(tmp_path / "missing")
    bad = subprocess.run(script, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "no LeRobotDataset at WM_DATA=" in bad.stdout


def _row(section, shape, method, fwd, fwd_bwd=None):
    return {"section": section, "shape": shape, "method": method, "fwd_ms": fwd, "fwd_bwd_ms": fwd_bwd}


def test_speedups_and_targets_read_the_right_rows():
    """The GPU run's verdicts come from these two functions: ratios within one shape, the worst shape per target."""
    attention = [
        _row("attention", "a", "sdpa_dense_mask", 10.0, 40.0),
        _row("attention", "a", "flex_block_mask", 3.0, 12.0),
        _row("attention", "a", "ours_triton", 2.0, 8.0),  # 1.5x Flex fwd+bwd
        _row("attention", "b", "flex_block_mask", 3.0, 12.0),
        _row("attention", "b", "ours_triton", 2.0, 10.0),  # 1.2x: the worst shape decides
        _row("decode", "d", "sdpa_dense_mask", 3.0),
        _row("decode", "d", "ours_triton", 1.0),
    ]
    elementwise = [
        {"op": "adaln", "shape": "x", "method": "eager", "fwd_ms": 4.0, "fwd_bwd_ms": None},
        {"op": "adaln", "shape": "x", "method": "ours_triton", "fwd_ms": 1.0, "fwd_bwd_ms": None},
        {"op": "adaln", "shape": "y", "method": "ours_triton", "fwd_ms": None, "fwd_bwd_ms": None},  # failed
    ]
    ratios = speedups(attention, elementwise)
    got = {(r["what"], r["shape"], r["vs"], r["timing"]): r["speedup"] for r in ratios}
    assert got[("attention", "a", "flex_block_mask", "fwd_bwd_ms")] == pytest.approx(1.5)
    assert got[("attention", "a", "sdpa_dense_mask", "fwd_ms")] == pytest.approx(5.0)
    assert got[("decode", "d", "sdpa_dense_mask", "fwd_ms")] == pytest.approx(3.0)
    assert got[("adaln", "x", "eager", "fwd_ms")] == pytest.approx(4.0)
    assert not any(r["shape"] == "y" for r in ratios)  # no figure, no ratio
    imagine = [
        {"backend": "auto", "batch": 1, "frames_per_s": 42.0},
        {"backend": "sdpa", "batch": 1, "frames_per_s": 90.0},
    ]
    targets = {t["target"]: t for t in target_checks(ratios, imagine)}
    assert [t["met"] for t in targets.values()] == [False, True, True, False]
    assert targets["attention fwd+bwd: ours vs FlexAttention"]["measured (worst shape)"] == pytest.approx(1.2)
    assert targets["imagined frames/s at batch 1"]["measured (worst shape)"] == 42.0
