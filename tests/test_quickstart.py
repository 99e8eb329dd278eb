"""The quickstart runner: runs real scripts, skips finished stages, reports missing and failed ones."""

from __future__ import annotations

import json
import os

from worldloop.pipelines.quickstart import QuickstartConfig, Stage, is_done, run_stage, stages_for
from worldloop.world_model.recipe import TEACHER_FORCING_PHASE_ARGS


def _stage(tmp_path, body: str, name: str = "demo") -> Stage:
    script = tmp_path / f"{name}.py"
    script.write_text(body)
    marker = tmp_path / "out" / "done.txt"
    return Stage(name, str(script), [str(marker)], marker, marker.parent, lambda: {"value": 1.0})


WRITES_MARKER = "import pathlib, sys\np = pathlib.Path(sys.argv[1]); p.parent.mkdir(); p.write_text('ok')\n"


def test_stage_runs_then_is_skipped(tmp_path):
    stage = _stage(tmp_path, WRITES_MARKER)
    first = run_stage(stage, force=False, log_dir=tmp_path / "logs")
    assert first.status == "ran" and first.metrics == {"value": 1.0}
    assert (tmp_path / "logs" / "demo.log").is_file()
    assert run_stage(stage, force=False, log_dir=tmp_path / "logs").status == "skipped"


def test_failed_and_missing_stages_are_reported(tmp_path):
    failing = _stage(tmp_path, "raise SystemExit(3)\n", "fails")
    record = run_stage(failing, force=False, log_dir=tmp_path / "logs")
    assert record.status == "failed" and record.produced.endswith("fails.log")
    missing = Stage("gone", str(tmp_path / "nope.py"), [], tmp_path / "m", tmp_path)
    assert run_stage(missing, force=False, log_dir=tmp_path / "logs").status == "not available"


def test_an_incomplete_recording_is_not_done(tmp_path):
    marker = tmp_path / "meta" / "recording.json"
    marker.parent.mkdir()
    stage = Stage("record", "record_demos.py", [], marker, tmp_path)
    marker.write_text(json.dumps({"complete": False}))
    assert not is_done(stage)
    marker.write_text(json.dumps({"complete": True}))
    assert is_done(stage)


def test_a_stage_whose_input_was_made_anew_is_not_done(tmp_path):
    model, result = tmp_path / "training.json", tmp_path / "score.json"
    stage = Stage("score", "benchmarks/world_model_fidelity.py", [], result, result, inputs=(model,))
    result.write_text("{}")
    assert is_done(stage)  # an input that does not exist does not hold the stage back
    model.write_text("{}")
    os.utime(model, (result.stat().st_mtime + 5,) * 2)  # the model trained again after it was scored
    assert not is_done(stage)
    os.utime(result, (model.stat().st_mtime + 5,) * 2)
    assert is_done(stage)


def test_fast_mode_shrinks_every_budget_and_stages_use_one_dataset(tmp_path):
    cfg = QuickstartConfig(fast=True)
    cfg.apply_fast()
    assert cfg.demo_episodes <= 40 and cfg.world_model_steps <= 150 and cfg.finetune_iterations <= 2
    stages = stages_for(cfg, tmp_path)
    data_args = [a for s in stages for a in s.args if a.startswith(("--root=", "--dataset.root="))]
    assert len({a.split("=", 1)[1] for a in data_args}) == 1


def test_imagination_stages_use_the_world_model_with_heads_fitted_on_rollouts(tmp_path):
    stages = {s.name: s for s in stages_for(QuickstartConfig(), tmp_path)}
    heads = stages["fit outcome heads on rollouts"]
    assert "--heads_only=true" in heads.args
    assert f"--init_from={tmp_path / 'world_model_posttrained' / 'pretrained_model'}" in heads.args
    final = str(tmp_path / "world_model_final" / "pretrained_model")
    users = [s.name for s in stages.values() if any(final in a for a in s.args)]
    assert users and all(n not in ("train world model", "post-train world model") for n in users)
    names = list(stages)
    assert names.index("fit outcome heads on rollouts") > names.index("post-train world model")
    assert all(names.index(n) > names.index("fit outcome heads on rollouts") for n in users)


def test_the_world_model_trains_on_its_own_rollouts_before_post_training(tmp_path):
    stages = {s.name: s for s in stages_for(QuickstartConfig(), tmp_path)}
    names = list(stages)
    self_rollout = stages["train world model on its own rollouts"]
    assert "--model.self_rollout_frames=4" in self_rollout.args
    assert set(TEACHER_FORCING_PHASE_ARGS) <= set(stages["train world model"].args)  # the recipe's two phases
    assert f"--init_from={tmp_path / 'world_model' / 'pretrained_model'}" in self_rollout.args
    assert (
        names.index("train world model")
        < names.index(self_rollout.name)
        < names.index("post-train world model")
    )
    sr_model = f"--world_model.path={tmp_path / 'world_model_self_rollout' / 'pretrained_model'}"
    assert sr_model in stages["post-train world model"].args
    # 0 steps skips the stage, and post-training reads the teacher-forced model instead.
    skipped = {s.name: s for s in stages_for(QuickstartConfig(world_model_self_rollout_steps=0), tmp_path)}
    assert self_rollout.name not in skipped
    assert (
        f"--world_model.path={tmp_path / 'world_model' / 'pretrained_model'}"
        in skipped["post-train world model"].args
    )
