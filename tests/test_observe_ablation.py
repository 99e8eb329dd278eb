"""benchmarks/imagination_eval.py --observe: one ranking per observation mode, side by side, each naming its
judge; the first-frame mode's policies see only the start frame."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from imagination_fixtures import tiny_policy, tiny_world_model

import benchmarks._common
from benchmarks import imagination_eval


@pytest.mark.slow  # 3 modes x 2 policies x (imagination + sim): ~40 s
def test_observe_modes_rank_side_by_side(tmp_path, monkeypatch):
    tiny_world_model().save_pretrained(tmp_path / "wm")
    for i in range(2):
        tiny_policy(seed=i).save_pretrained(tmp_path / "zoo" / f"p{i}")
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    argv = ["imagination_eval.py", f"--world_model={tmp_path / 'wm'}", f"--zoo={tmp_path / 'zoo'}",
            "--episodes=3", "--horizon=4", "--batch_envs=3", "--observe=[drawn,first_frame,sim]",
            f"--output_dir={tmp_path / 'out'}", "--name=ablation"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    imagination_eval.main()
    figures = json.loads((tmp_path / "results" / "ablation.json").read_text())["figures"]
    assert [r["observe"] for r in figures["runs"]] == ["drawn", "first_frame", "sim"]
    assert figures["judge"]["kind"] == "drawn_frames" and figures["observe"] == "drawn"
    # the runs' scatters side by side, in the file the result names
    assert figures["scatter_png"].endswith("imagined_vs_sim_by_observe.png")
    assert Path(figures["scatter_png"]).stat().st_size > 1000
    assert set(figures["runs"][0]["met"]) == {"pearson", "spearman", "mmrv", "gap"}
    # the imagined actions played in the sim split the error where the policy acted in imagination, not in sim
    assert [("error_split" in r) for r in figures["runs"]] == [True, True, False]
    assert figures["error_split"]["actions_in_sim"] == figures["runs"][0]["error_split"]["actions_in_sim"]
    for mode in ("drawn", "first_frame", "sim"):
        saved = json.loads((tmp_path / "out" / f"observe_{mode}_seed100000" / "ranking.json").read_text())
        assert saved["summary"]["judge"]["observe"] == mode
        imagined = saved["policies"]["p0"]["imagination"]
        assert imagined["judge"]["observe"] == mode
        assert (imagined["backend"] == "sim_judged") is (mode == "sim")
        assert (imagined["sim_steps"] > 0) is (mode == "sim")  # only the judged sim steps the physics
    for row in figures["runs"]:
        low, high = row["spearman_ci95"]
        assert not low > high  # NaN where a side is constant on every resample (random tiny policies)
