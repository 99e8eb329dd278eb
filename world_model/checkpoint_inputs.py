"""What a trained world model says about its inputs, read by every stage after training.

A checkpoint holds the embodiment the model was trained for (`embodiment.yaml`) and, in its config, the
frame size, cameras, state and action sizes and the resize its training data went through. Imagination,
calibration, post-training, fine-tuning, ranking and the benchmarks take them from there: an option that
repeats them is accepted, one that contradicts them is an error naming both values.

Checkpoints written before embodiments were stored have no `embodiment.yaml`. Their fallback: a model
acting in 4 dimensions is taken to be for the built-in tabletop arm (`worldloop_arm4`, the only arm such
checkpoints were trained for; a note says so), any other needs `--embodiment=<name or YAML file>`.
"""

from __future__ import annotations

import warnings

from worldloop.common.config import ConfigError
from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec, load_embodiment
from worldloop.data.dataset import DatasetConfig
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.model import WorldModel


def embodiment_of(model: WorldModel, override: str = "", option: str = "embodiment") -> EmbodimentSpec:
    """The embodiment `model` acts for: the one its checkpoint stores. `override` (the value of `--option`,
    a built-in name or a YAML file; "" for none) must be that same robot; for a checkpoint that stores none
    it names it (see the module docstring for the fallback without one)."""
    stored = model.embodiment
    given = _load(override, option) if override else None
    if stored is not None:
        if given is not None and given != stored:
            raise ConfigError(
                f"--{option}={override!r} contradicts the world model's stored embodiment "
                f"{stored.name!r} ({'; '.join(given.differences(stored))}): drop --{option} to use the "
                "stored one"
            )
        return stored
    spec = given
    if spec is None:
        if model.cfg.dit.action_dim != TABLETOP_ARM.num_joints:
            raise ConfigError(
                f"the world model stores no embodiment (a checkpoint from before embodiment.yaml) and acts "
                f"in {model.cfg.dit.action_dim} dims: pass --{option}=<a built-in name or an embodiment YAML "
                "file> for the robot it was trained on"
            )
        warnings.warn(
            f"the world model stores no embodiment (an older checkpoint): taking it to be for "
            f"{TABLETOP_ARM.name!r}, the arm such checkpoints were trained for",
            stacklevel=2,
        )
        spec = TABLETOP_ARM
    if spec.num_joints != model.cfg.dit.action_dim:
        raise ConfigError(
            f"--{option}={spec.name!r} has {spec.num_joints} joints but the world model acts in "
            f"{model.cfg.dit.action_dim} dims"
        )
    return spec


def _load(value: str, option: str) -> EmbodimentSpec:
    if value in ("from_dataset", "auto"):
        raise ConfigError(
            f"--{option}={value}: a dataset is read for the embodiment when the world model is trained (or "
            "calibrated: train_world_model.py --init_from=<model> --calibrate_only=true, which stores it in "
            f"an older checkpoint); here --{option} takes a built-in name or a YAML file"
        )
    try:
        return load_embodiment(value)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"--{option}: {e}") from e


def dataset_config_for(cfg: WorldModelConfig, ds: DatasetConfig, option: str = "dataset") -> DatasetConfig:
    """`ds` completed with what a model of config `cfg` reads (cameras, frame size, state and action sizes, and its
    training data's resize when `ds.resize` is unset), after checking that nothing set in `ds` (the
    options `--<option>.*`) contradicts them. Returns `ds`, filled in."""
    wanted = {
        "cameras": list(cfg.cameras),
        "image_size": [cfg.frame_size, cfg.frame_size],
        "state_dim": cfg.idm.state_dim,
        "action_dim": cfg.dit.action_dim,
    }
    for key, value in wanted.items():
        given = getattr(ds, key)
        given = list(given) if isinstance(given, (list, tuple)) else given
        if given and given != value:  # [] and 0 mean unset
            raise ConfigError(
                f"--{option}.{key}={given} contradicts the world model, which reads {key}={value} "
                f"(its checkpoint's config.yaml): drop --{option}.{key}"
            )
        setattr(ds, key, value)
    ds.resize = ds.resize or cfg.dataset_resize
    return ds
