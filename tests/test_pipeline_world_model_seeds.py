"""pipelines/world_model_seeds.py (python -m worldloop.pipelines.world_model_seeds): every stage's command parses,
the two arms of a pair differ only by the candidate's overrides, first phases are shared, the printed comparison
names the results the scorings write, bad config names the field; and the stage runner's groups run side by
side."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import pytest
from command_fixtures import ROOT

from benchmarks.world_model_fidelity import FidelityBenchmarkConfig
from benchmarks.world_model_seeds import SeedComparisonConfig
from worldloop.common.config import ConfigError, parse_cli
from worldloop.pipelines.quickstart import Stage, run_stages
from worldloop.pipelines.world_model_seeds import WorldModelSeedsConfig, stages, trained_otherwise
from worldloop.sim.recording import RecordingConfig
from worldloop.world_model.recipe import SELF_ROLLOUT_STEPS, TEACHER_FORCING_PHASE_ARGS
from worldloop.world_model.trainer import TrainWorldModelConfig

CONFIGS = {
    "record_demos.py": RecordingConfig,
    "train_world_model.py": TrainWorldModelConfig,
    "benchmarks/world_model_fidelity.py": FidelityBenchmarkConfig,
    "benchmarks/world_model_seeds.py": SeedComparisonConfig,
}
MW10 = ["--model.motion_loss_weight=10", "--model.motion_loss_span=window"]


def _cfg(tmp_path: Path, **kw) -> WorldModelSeedsConfig:
    kw = {"name": "mw10", "candidate": MW10, **kw}
    cfg = WorldModelSeedsConfig(models=str(tmp_path / "wm"), data_root=str(tmp_path / "data"),
                                keep_lower=["cube_error@30"], max_rise={"idm_ratio@30": 0.2}, **kw)  # fmt: skip
    cfg.validate()
    return cfg


def test_the_arms_of_a_pair_differ_only_by_the_candidate_and_share_their_first_phase(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the stages' config paths are relative to the repository
    cfg = _cfg(tmp_path, seeds=[3, 4, 5], first_phase_seeds=[0, 1, 1], jobs=2)
    parsed = {s.name: parse_cli(CONFIGS[s.script], s.args) for s in stages(cfg, Path(cfg.root))}
    assert list(parsed)[:2] == ["check the keep rule", "record push data"]
    assert parsed["record push data"].environment_state and list(parsed)[-1] == "compare the arms"
    firsts = [n for n in parsed if n.endswith("_tf")]
    assert firsts == ["train push_tf", "train push_s1_tf"]  # seed 1's first phase is trained once
    assert [parsed[n].train.seed for n in firsts] == [0, 1]
    # the recipe's first phase: tiny.yaml with world_model/recipe.py's first-phase overrides
    tiny = ["--config=configs/world_model/tiny.yaml"]
    recipe_lr = parse_cli(TrainWorldModelConfig, [*tiny, *TEACHER_FORCING_PHASE_ARGS]).train.lr
    assert recipe_lr != parse_cli(TrainWorldModelConfig, tiny).train.lr
    assert all(parsed[n].train.lr == recipe_lr for n in firsts)
    for seed, first in ((3, "push_tf"), (4, "push_s1_tf"), (5, "push_s1_tf")):
        base, cand = parsed[f"train push_s{seed}_sr"], parsed[f"train push_s{seed}_sr_mw10"]
        assert base.init_from == cand.init_from == str(tmp_path / "wm" / first / "pretrained_model")
        assert base.train.seed == cand.train.seed == seed and base.train.steps == SELF_ROLLOUT_STEPS
        assert base.model.self_rollout_frames == 4 and base.model.dit.warp_read == "bicubic"
        assert (base.model.motion_loss_weight, cand.model.motion_loss_weight) != (10, 10)
        assert cand.model.motion_loss_weight == 10 and cand.model.motion_loss_span == "window"
        base.model.motion_loss_weight, base.model.motion_loss_span = 10, "window"
        base.output_dir = cand.output_dir
        assert base == cand  # nothing else differs
        score = parsed[f"score push_s{seed}_sr_mw10"]
        assert score.model_path == str(tmp_path / "wm" / f"push_s{seed}_sr_mw10" / "pretrained_model")
        assert score.name == f"world_model_fidelity_push_s{seed}_sr_mw10"
    # A pair's trainings read the data and their first phase; a scoring reads its model; nothing else waits.
    needs = {st.name: st.needs for st in stages(cfg, Path(cfg.root))}
    assert needs["train push_s1_tf"] == ("record push data",)
    assert needs["train push_s5_sr_mw10"] == ("record push data", "train push_s1_tf")
    assert needs["score push_s3_sr"] == ("train push_s3_sr",)
    # With two jobs every training and scoring runs on a core of its own.
    threads = max(1, (os.cpu_count() or 1) // 2)
    heavy = [st for st in stages(cfg, Path(cfg.root)) if st.name.split()[0] in ("train", "score")]
    assert len(heavy) == 2 + 6 + 6
    assert all(st.launcher[:2] == ["env", f"OMP_NUM_THREADS={threads}"] for st in heavy)
    cfg.jobs = 1
    assert all(st.launcher == [sys.executable] for st in stages(cfg, Path(cfg.root)))
    # The keep rule is checked first and applied last, on the six scorings.
    check, compare = parsed["check the keep rule"], parsed["compare the arms"]
    assert check.check_only and not compare.check_only
    for rule in (check, compare):
        assert rule.keep_lower == ["cube_error@30"] and rule.keep_higher == [] and rule.max_drop == {}
        assert rule.max_rise == {"idm_ratio@30": 0.2} and rule.name == "world_model_seeds_push_mw10"
        assert rule.candidate == [
            f"benchmarks/results/world_model_fidelity_push_s{s}_sr_mw10.json" for s in (3, 4, 5)
        ]
        assert rule.baseline == [
            f"benchmarks/results/world_model_fidelity_push_s{s}_sr.json" for s in (3, 4, 5)
        ]
    assert needs["record push data"] == ("check the keep rule",)
    # The check writes nothing and says so; the comparison produces the rule's result.
    by_name = {st.name: st for st in stages(cfg, Path(cfg.root))}
    assert by_name["check the keep rule"].produced is None
    assert (
        by_name["compare the arms"].produced == ROOT / "benchmarks/results/world_model_seeds_push_mw10.json"
    )
    assert sorted(needs["compare the arms"]) == sorted(n for n in parsed if n.startswith("score "))
    assert len(needs["compare the arms"]) == 6


def test_a_first_phase_candidate_trains_its_own_first_phase_and_its_second_phase_starts_there(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(ROOT)
    cfg = _cfg(tmp_path, name="tfmw10", seeds=[3, 4], first_phase_seeds=[0, 1], candidate=[],
               first_phase_candidate=MW10)  # fmt: skip
    parsed = {s.name: parse_cli(CONFIGS[s.script], s.args) for s in stages(cfg, Path(cfg.root))}
    firsts = [n for n in parsed if n.startswith("train ") and "_sr" not in n]
    assert firsts == ["train push_tf", "train push_tf_tfmw10", "train push_s1_tf", "train push_s1_tf_tfmw10"]
    for shared in ("push_tf", "push_s1_tf"):
        base, cand = parsed[f"train {shared}"], parsed[f"train {shared}_tfmw10"]
        assert base.model.motion_loss_weight == 0 and cand.model.motion_loss_weight == 10
        cand.model.motion_loss_weight, cand.model.motion_loss_span = 0, base.model.motion_loss_span
        cand.output_dir = base.output_dir
        assert base == cand  # only the first-phase overrides differ
    needs = {st.name: st.needs for st in stages(cfg, Path(cfg.root))}
    for seed, shared in ((3, "push_tf"), (4, "push_s1_tf")):
        base, cand = parsed[f"train push_s{seed}_sr"], parsed[f"train push_s{seed}_sr_tfmw10"]
        assert base.init_from == str(tmp_path / "wm" / shared / "pretrained_model")
        assert cand.init_from == str(tmp_path / "wm" / f"{shared}_tfmw10" / "pretrained_model")
        assert needs[f"train push_s{seed}_sr_tfmw10"] == ("record push data", f"train {shared}_tfmw10")
        cand.init_from, cand.output_dir = base.init_from, base.output_dir
        assert base == cand  # the second phases are the recipe's in both arms


def test_first_phases_are_scored_only_when_asked_each_once_after_the_comparison(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    kw = {"name": "tfmw10", "seeds": [3, 4, 5], "first_phase_seeds": [0, 1, 1], "first_phase_candidate": MW10}
    names = [s.name for s in stages(_cfg(tmp_path, **kw), tmp_path / "root")]
    assert not [n for n in names if n.startswith("score") and "_sr" not in n]
    run = stages(_cfg(tmp_path, **kw, score_first_phases=True), tmp_path / "root")
    firsts = [s for s in run if s.name.startswith("score") and "_sr" not in s.name]
    assert [s.name for s in firsts] == ["score push_tf", "score push_tf_tfmw10", "score push_s1_tf",
                                        "score push_s1_tf_tfmw10"]  # fmt: skip
    assert [s.name for s in run].index("compare the arms") < [s.name for s in run].index("score push_tf")
    compare = next(s for s in run if s.name == "compare the arms")
    assert not set(compare.needs) & {s.name for s in firsts}  # the comparison does not wait for them
    for st in firsts:
        parsed = parse_cli(FidelityBenchmarkConfig, st.args)
        assert parsed.model_path == str(tmp_path / "wm" / st.name.removeprefix("score ") / "pretrained_model")
        assert st.needs == (f"train {st.name.removeprefix('score ')}",)


def test_a_rule_that_names_an_unknown_figure_stops_before_anything_trains(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _cfg(tmp_path, keep_higher=["cube_speed"])
    check = stages(cfg, Path(cfg.root))[0]
    with pytest.raises(ConfigError, match="cube_speed"):
        parse_cli(SeedComparisonConfig, check.args).validate()
    records = run_stages(stages(cfg, Path(cfg.root)), False, tmp_path / "run", jobs=2)
    assert [(r.name, r.status) for r in records] == [("check the keep rule", "failed")]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "a/b"}, "name"),
        ({"candidate": []}, "candidate / first_phase_candidate"),
        ({"first_phase_candidate": ["model.x=1"]}, "first_phase_candidate"),
        ({"candidate": ["model.x=1"]}, "candidate"),
        ({"seeds": [3, 4], "first_phase_seeds": [0]}, "first_phase_seeds"),
        ({"seeds": [3, 3], "first_phase_seeds": [0, 1]}, "seeds"),
        ({"jobs": 0}, "jobs"),
        ({"keep_lower": []}, "keep_higher / keep_lower"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    cfg = WorldModelSeedsConfig(
        **{"name": "x", "candidate": ["--a=1"], "keep_lower": ["ssim@30"], **overrides}
    )
    with pytest.raises(ConfigError, match=field):
        cfg.validate()


def test_a_model_trained_otherwise_than_its_stage_stops_the_run_and_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _cfg(tmp_path, seeds=[3], first_phase_seeds=[0])
    train = {st.name: st for st in stages(cfg, Path(cfg.root))}["train push_s3_sr"]
    record = train.done_marker
    record.parent.mkdir(parents=True)

    def trained_with(args):
        record.write_text(json.dumps({"command": shlex.join(["python", "train_world_model.py", *args])}))

    # The same overrides, the config path absolute, another order, resumed and written elsewhere: the same model.
    args = [a.replace("--config=configs/", f"--config={ROOT}/configs/") for a in train.args]
    assert args != train.args
    trained_with([*reversed(args), "--resume=true", "--output_dir=/elsewhere"])
    assert trained_otherwise(train) == ""
    assert "train push_s3_sr" in [st.name for st in stages(cfg, Path(cfg.root))]
    # Trained before the recipe took its motion weights: named, with what changed, and left as it is.
    trained_with([a for a in train.args if "motion_loss" not in a])
    assert trained_otherwise(train).endswith("--model.motion_loss_weight=<unset> -> 3")
    with pytest.raises(
        SystemExit, match=r"push_s3_sr/pretrained_model: --model.motion_loss_span=<unset> -> window"
    ):
        stages(cfg, Path(cfg.root))
    assert record.is_file()


def test_with_a_referee_every_scoring_reads_it_and_one_scored_without_stops_the_run(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = _cfg(tmp_path, seeds=[3], first_phase_seeds=[0], referee_idm=str(tmp_path / "ref"))
    scores = [st for st in stages(cfg, Path(cfg.root)) if st.name.startswith("score ")]
    assert len(scores) == 2
    for st in scores:
        assert parse_cli(FidelityBenchmarkConfig, st.args).referee_idm == str(tmp_path / "ref")
    # the baseline's result exists from a scoring without the referee: named, and left as it is
    monkeypatch.setattr("worldloop.pipelines.world_model_seeds.REPO", tmp_path)  # results under tmp_path
    plain = _cfg(tmp_path, seeds=[3], first_phase_seeds=[0])
    old = next(st for st in stages(plain, Path(plain.root)) if st.name == "score push_s3_sr")
    old.done_marker.parent.mkdir(parents=True, exist_ok=True)
    old.done_marker.write_text(json.dumps({"command": shlex.join(["python", old.script, *old.args])}))
    assert stages(plain, Path(plain.root))  # scored as its stage would score it: no complaint
    with pytest.raises(SystemExit, match=r"world_model_fidelity_push_s3_sr.json: --referee_idm=<unset> -> "):
        stages(cfg, Path(cfg.root))
    assert old.done_marker.is_file()


# Writes, when it ends, the time it started.
SLEEPS = "import pathlib, sys, time\nt = time.time()\ntime.sleep(1.0)\npathlib.Path(sys.argv[1]).write_text(str(t))\n"


def test_side_by_side_a_stage_starts_once_what_it_needs_is_done_and_none_after_a_failure(tmp_path):
    script, fails = tmp_path / "sleeps.py", tmp_path / "fails.py"
    script.write_text(SLEEPS)
    fails.write_text("raise SystemExit(2)\n")

    def stage(name, needs, path=script):
        marker = tmp_path / f"{name}.done"
        return Stage(name, str(path), [str(marker)], marker, marker, needs=needs)

    # a and b need nothing, c needs a, d every stage before it: a+b, then c, then d.
    run = [stage("a", ()), stage("b", ()), stage("c", ("a",)), stage("d", None)]
    records = run_stages(run, False, tmp_path / "run", jobs=2)
    assert [(r.name, r.status) for r in records] == [("a", "ran"), ("b", "ran"), ("c", "ran"), ("d", "ran")]
    start = {n: float((tmp_path / f"{n}.done").read_text()) for n in "abcd"}
    end = {n: (tmp_path / f"{n}.done").stat().st_mtime for n in "abcd"}
    assert start["b"] < end["a"] and start["a"] < end["b"]  # side by side
    assert start["c"] >= end["a"] and start["d"] >= max(end["a"], end["b"], end["c"])
    # Done stages are skipped; a failure lets the running stage end and starts nothing more.
    records = run_stages([*run, stage("e", (), fails), stage("f", ()), stage("g", ("f",))], False,
                         tmp_path / "run", jobs=2)  # fmt: skip
    assert [(r.name, r.status) for r in records][:4] == [(n, "done earlier") for n in "abcd"]
    assert [(r.name, r.status) for r in records][4:] == [("e", "failed"), ("f", "ran")]  # g never starts
    with pytest.raises(ValueError, match="nope"):
        run_stages([stage("h", ("nope",))], False, tmp_path / "run2", jobs=2)
    # One at a time, the first failure stops the run at once.
    records = run_stages([stage("i", (), fails), stage("j", ())], False, tmp_path / "run3", jobs=1)
    assert [(r.name, r.status) for r in records] == [("i", "failed")]


def test_a_comparison_reads_a_logged_scoring_unless_the_model_was_trained_since(tmp_path, monkeypatch):
    from worldloop.pipelines import world_model_seeds

    repo = tmp_path / "repo"
    monkeypatch.setattr(world_model_seeds, "REPO", repo)
    cfg = _cfg(tmp_path, seeds=[3], first_phase_seeds=[0])
    logged = repo / "docs/results/world_model_fidelity_push_s3_sr.json"
    trained = tmp_path / "wm/push_s3_sr/pretrained_model/training.json"
    for path in (logged, trained):
        path.parent.mkdir(parents=True)

    def scored_at() -> tuple[Path, list[str]]:
        by_name = {st.name: st for st in stages(cfg, Path(cfg.root))}
        compare = parse_cli(SeedComparisonConfig, by_name["compare the arms"].args)
        return by_name["score push_s3_sr"].done_marker, compare.baseline

    # Nothing logged: scored where the benchmark writes.
    current = repo / "benchmarks/results/world_model_fidelity_push_s3_sr.json"
    assert scored_at() == (current, ["benchmarks/results/world_model_fidelity_push_s3_sr.json"])
    # Trained, then scored and the scoring logged: read from the log, not scored again.
    by_name = {st.name: st for st in stages(cfg, Path(cfg.root))}
    for path, stage in ((trained, "train push_s3_sr"), (logged, "score push_s3_sr")):
        st = by_name[stage]
        path.write_text(json.dumps({"command": shlex.join(["python", st.script, *st.args])}))
    os.utime(trained, (1e9, 1e9))
    assert scored_at() == (logged, ["docs/results/world_model_fidelity_push_s3_sr.json"])
    # Trained again after the log: scored anew where the benchmark writes, and that copy is compared.
    os.utime(trained, (logged.stat().st_mtime + 10,) * 2)
    assert scored_at()[1] == ["benchmarks/results/world_model_fidelity_push_s3_sr.json"]
    # A current scoring beside the logged one wins.
    os.utime(trained, (1e9, 1e9))
    current.parent.mkdir(parents=True)
    current.write_text(logged.read_text())
    assert scored_at() == (current, ["benchmarks/results/world_model_fidelity_push_s3_sr.json"])
    # A model not trained yet will be: its scoring is the new one.
    assert "benchmarks/results" in str(world_model_seeds.fidelity_json("push_s9_sr", tmp_path / "wm"))
