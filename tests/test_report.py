"""The run report is one self-contained page whose figures and videos load in a real browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import imageio.v3 as iio
import numpy as np
import pytest

from worldloop.pipelines.report import Media, StageRecord, write_report


def _media(tmp_path):
    png = tmp_path / "curve.png"
    iio.imwrite(png, np.full((16, 24, 3), 200, dtype=np.uint8))
    gif = tmp_path / "side_by_side.gif"
    frames = np.stack([np.full((8, 16, 3), 30 * i, dtype=np.uint8) for i in range(4)])
    iio.imwrite(gif, frames, duration=100, loop=0)
    return [Media("learning curve", png)], [Media("episode 0", gif, "real | imagined")]


def _report(tmp_path):
    figures, videos = _media(tmp_path)
    stages = [
        StageRecord("record", "ran", 12.0, "outputs/x/data", {"episodes": 10}),
        StageRecord("world model", "skipped", 0.0, "outputs/x/wm"),
    ]
    return write_report(tmp_path / "report.html", "run x", stages, figures, videos, {"success": 0.5})


def test_report_is_self_contained(tmp_path):
    page = _report(tmp_path).read_text()
    assert page.count("data:image/png;base64,") == 1
    assert page.count("data:image/gif;base64,") == 1
    assert "world model" in page and "skipped" in page
    assert not re.search(r"src='(?!data:)", page), "every medium must be embedded"


def test_unsupported_media_is_a_clear_error(tmp_path):
    bad = tmp_path / "clip.avi"
    bad.write_bytes(b"x")
    with pytest.raises(ValueError, match="clip.avi"):
        write_report(tmp_path / "r.html", "r", [], [Media("bad", bad)], [])


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(tmp_path):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: the Makefile's apt step should install it")
        pytest.skip("chromium is not installed")
    page = _report(tmp_path)
    out = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'data-media-ok="2/2"' in out.stdout, out.stdout[-2000:]


def test_a_disagreement_is_shown_on_top_with_both_numbers(tmp_path):
    import json

    from worldloop.pipelines.quickstart import _ranking_metrics
    from worldloop.rl_finetune.imagination.ranking import disagreement

    def stage(imagined: dict, sim: dict, name: str) -> StageRecord:
        # What evaluate_policy --backend imagination --compare_sim writes for one policy (ranking.json).
        record = {"imagination": imagined, "sim": sim, "disagreement": disagreement(imagined, sim)}
        out = tmp_path / name
        out.mkdir()
        (out / "ranking.json").write_text(json.dumps({"policies": {"bc": record}}))
        return StageRecord(name, "ran", 1.0, str(out), _ranking_metrics(out))

    def summary(rate: float, ci: list[float]) -> dict:
        return {"success_rate": rate, "success_ci95": ci, "mean_progress": rate}

    apart = stage(summary(0.8, [0.58, 0.92]), summary(0.1, [0.03, 0.30]), "apart")
    close = stage(summary(0.6, [0.31, 0.83]), summary(0.1, [0.02, 0.40]), "close")
    page = write_report(tmp_path / "r.html", "r", [apart, close], [], []).read_text()
    warning = page[page.index("<div class='warning'>") : page.index("<h2>Stages</h2>")]
    assert "apart" in warning and "close" not in warning
    assert "imagination 80% (95% CI 58%-92%) vs sim 10% (95% CI 3%-30%)" in warning
    page = write_report(tmp_path / "r.html", "r", [close], [], []).read_text()
    assert "<div class='warning'>" not in page and "0.31-0.83" in page  # both intervals still in the table
