"""benchmarks/world_model_seeds.py: paired per-seed comparison of fidelity results, on known inputs."""

from __future__ import annotations

import json
import sys

import pytest
from command_fixtures import ROOT

import benchmarks._common
from benchmarks.world_model_seeds import FIGURES, SeedComparisonConfig, compare, main, read_figures


def fidelity_result(
    path, ssim30: float, idm: float, windows: int = 64, root: str = "outputs/data/push_wm", cpu: str = "CPU A"
):
    """A fidelity-shaped JSON whose every figure is 1.0 but SSIM@30 and the IDM ratio, scored on `root` on a
    host whose CPU model is `cpu`."""
    ssim = [1.0] * 30
    ssim[29] = ssim30
    issue = {key: 1.0 for section, key, _ in FIGURES.values() if section == "targets_issue24"}
    issue["idm_error_ratio_h30"] = idm
    figures = {"windows": windows, "curves": {"ssim": ssim, "psnr": [20.0] * 30}, "targets_issue24": issue}
    command = f"python benchmarks/world_model_fidelity.py --model_path=m '--dataset.root={root}' --eval.max_windows=64"
    machine = {"cpu_model": cpu, "cpu_extensions": ["avx2", "avx512f"]}
    path.write_text(json.dumps({"command": command, "machine": machine, "figures": figures}))
    return str(path)


def test_paired_differences_means_and_keep_rule(tmp_path):
    base = [
        read_figures(fidelity_result(tmp_path / f"b{i}.json", s, r))[0]
        for i, (s, r) in enumerate([(0.80, 8.0), (0.82, 6.0), (0.84, 7.0)])
    ]
    cand = [
        read_figures(fidelity_result(tmp_path / f"c{i}.json", s, r))[0]
        for i, (s, r) in enumerate([(0.85, 3.0), (0.83, 4.0), (0.86, 5.0)])
    ]
    out = compare(base, cand, SeedComparisonConfig())
    ssim = out["figures"]["ssim@30"]
    assert ssim["difference"]["mean"] == pytest.approx((0.05 + 0.01 + 0.02) / 3)
    assert ssim["baseline_mean"]["mean"] == pytest.approx(0.82)
    assert ssim["difference"]["low"] < ssim["difference"]["mean"] < ssim["difference"]["high"]
    assert out["figures"]["idm_ratio@30"]["difference"]["mean"] == pytest.approx(-3.0)
    assert out["kept"] is True
    # One seed pair where the candidate is worse on SSIM@30 and the rule says no.
    cand[1]["ssim@30"] = 0.81
    out = compare(base, cand, SeedComparisonConfig())
    assert out["keep_rule"]["wins_per_seed"]["ssim@30"] == [True, False, True]
    assert out["kept"] is False


def test_guards_allow_a_bounded_rise_and_require_beating_copy_last(tmp_path):
    """`max_rise` lets a figure be worse by at most its allowance in any pair; a candidate that does not beat
    copy-last at every horizon in some seed is not kept, however it wins elsewhere."""
    base = [read_figures(fidelity_result(tmp_path / f"b{i}.json", 0.80, 8.0))[0] for i in range(3)]
    cand = [read_figures(fidelity_result(tmp_path / f"c{i}.json", 0.85, 3.0))[0] for i in range(3)]
    for run, cube in zip(base, [3.7, 3.9, 4.2]):
        run["cube_error@30"] = cube
    for run, cube in zip(cand, [4.0, 3.5, 4.45]):  # +0.30, -0.40, +0.25
        run["cube_error@30"] = cube
    cfg = SeedComparisonConfig(max_rise={"cube_error@30": 0.3})
    out = compare(base, cand, cfg)
    assert out["keep_rule"]["guards_per_seed"]["cube_error@30"] == [True, True, True]
    assert out["kept"] is True
    cand[0]["cube_error@30"] = 4.01  # +0.31
    out = compare(base, cand, cfg)
    assert out["keep_rule"]["guards_per_seed"]["cube_error@30"] == [False, True, True]
    assert out["kept"] is False
    cand[0]["cube_error@30"] = 4.0
    cand[2]["psnr_above_copy_last"] = 0.0  # one horizon where copying the last frame wins
    out = compare(base, cand, cfg)
    assert out["keep_rule"]["guards_per_seed"]["psnr_above_copy_last"] == [True, True, False]
    assert out["kept"] is False
    assert compare(base, cand, SeedComparisonConfig(max_rise={"cube_error@30": 0.3}, beat_copy_last=False))[
        "kept"
    ]
    with pytest.raises(ValueError, match="max_rise allowances must be >= 0"):
        SeedComparisonConfig(baseline=["a"], candidate=["b"], max_rise={"cube_error@30": -1.0}).validate()


def test_max_drop_lets_a_higher_is_better_figure_fall_by_at_most_its_allowance(tmp_path):
    base = [read_figures(fidelity_result(tmp_path / f"b{i}.json", 0.80, 8.0))[0] for i in range(3)]
    cand = [read_figures(fidelity_result(tmp_path / f"c{i}.json", 0.85, 3.0))[0] for i in range(3)]
    for run, r in zip(base, [0.80, 0.75, 0.78]):
        run["cube_r"] = r
    for run, r in zip(cand, [0.76, 0.90, 0.735]):  # -0.04, +0.15, -0.045
        run["cube_r"] = r
    cfg = SeedComparisonConfig(max_drop={"cube_r": 0.05}, beat_copy_last=False)
    out = compare(base, cand, cfg)
    assert out["keep_rule"]["guards_per_seed"]["cube_r"] == [True, True, True]
    assert out["keep_rule"]["max_drop"] == {"cube_r": 0.05}
    assert out["kept"] is True
    cand[2]["cube_r"] = 0.72  # -0.06
    out = compare(base, cand, cfg)
    assert out["keep_rule"]["guards_per_seed"]["cube_r"] == [True, True, False]
    assert out["kept"] is False
    with pytest.raises(ValueError, match="max_drop allowances must be >= 0"):
        SeedComparisonConfig(baseline=["a"], candidate=["b"], max_drop={"cube_r": -0.1}).validate()
    with pytest.raises(ValueError, match="unknown figures"):
        SeedComparisonConfig(baseline=["a"], candidate=["b"], max_drop={"fps": 0.1}).validate()


def test_bad_inputs_name_the_file_or_field(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        read_figures(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"figures": {"curves": {}}}))
    with pytest.raises(ValueError, match="other.json: figures.curves.ssim"):
        read_figures(tmp_path / "other.json")
    with pytest.raises(ValueError, match="one fidelity JSON per seed"):
        SeedComparisonConfig(baseline=["a"], candidate=[]).validate()
    with pytest.raises(ValueError, match="unknown figures"):
        SeedComparisonConfig(baseline=["a"], candidate=["b"], keep_higher=["fps"]).validate()
    # Results scored on different held-out windows are not pairs.
    a = fidelity_result(tmp_path / "a.json", 0.8, 8.0, windows=64)
    b = fidelity_result(tmp_path / "b.json", 0.8, 8.0, windows=16)
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(sys, "argv", ["world_model_seeds.py", f"--baseline=[{a}]", f"--candidate=[{b}]"])
    with pytest.raises(ValueError, match="different numbers of held-out windows"):
        main()
    # Nor are results scored on different datasets; the error names which file used which.
    c = fidelity_result(tmp_path / "c.json", 0.8, 8.0, root="outputs/data/reach_wm")
    monkeypatch.setattr(sys, "argv", ["world_model_seeds.py", f"--baseline=[{a}]", f"--candidate=[{c}]"])
    with pytest.raises(ValueError, match=r"different datasets .*reach_wm': \['[^]]*c.json'\]"):
        main()
    # The same root given relative to the repository and absolute is one dataset.
    whole = fidelity_result(tmp_path / "d.json", 0.8, 8.0, root=str(ROOT / "outputs/data/push_wm"))
    assert read_figures(whole)[1] == read_figures(a)[1] == (64, str(ROOT / "outputs/data/push_wm"))


def test_main_writes_the_comparison(tmp_path, monkeypatch, capsys):
    a = [fidelity_result(tmp_path / f"a{i}.json", 0.8 + i / 100, 8.0) for i in range(3)]
    b = [
        fidelity_result(tmp_path / f"b{i}.json", 0.79, 9.0, cpu="CPU B" if i == 2 else "CPU A")
        for i in range(3)
    ]
    monkeypatch.setattr(benchmarks._common, "RESULTS", tmp_path / "results")
    args = [f"--baseline=[{','.join(a)}]", f"--candidate=[{','.join(b)}]", "--name=seeds_test"]
    monkeypatch.setattr(sys, "argv", ["world_model_seeds.py", *args])
    main()
    written = json.loads((tmp_path / "results" / "seeds_test.json").read_text())
    assert written["figures"]["kept"] is False
    assert written["figures"]["seeds"] == 3
    assert written["figures"]["candidate_files"] == b
    # the third pair was measured on another host, and is named as such
    hosts = written["figures"]["hosts"]
    assert hosts["differ_per_seed"] == [False, False, True]
    assert hosts["candidate"][2] == "CPU B [avx2 avx512f]"
    assert "seed pair 2: measured on different hosts" in capsys.readouterr().out


def test_a_result_name_is_a_file_name_not_a_path():
    with pytest.raises(ValueError, match="plain file name"):
        benchmarks._common.write_result("../elsewhere", {})


def test_figures_older_results_lack_are_left_out_unless_the_rule_needs_them(tmp_path):
    paths = [fidelity_result(tmp_path / f"r{i}.json", 0.8 + i / 100, 5.0) for i in range(4)]
    old = json.loads(open(paths[0]).read())
    del old["figures"]["targets_issue24"]["cube_one_step_slope"]
    open(paths[0], "w").write(json.dumps(old))
    runs = [read_figures(p)[0] for p in paths]
    assert "cube_step_slope" not in runs[0] and "cube_step_slope" in runs[1]
    out = compare(runs[:2], runs[2:], SeedComparisonConfig())
    assert out["left_out"] == ["cube_step_slope"] and "cube_step_slope" not in out["figures"]
    with pytest.raises(ValueError, match="cube_step_slope"):
        compare(runs[:2], runs[2:], SeedComparisonConfig(keep_higher=["cube_step_slope"]))
