"""Any policy saved by LeRobot itself, loaded from a local directory, behind worldloop's `Policy` interface.

The directory is what LeRobot's `save_pretrained` writes: `config.json` (its `type` picks the class through
LeRobot's registry, `lerobot.policies.factory.get_policy_class`), `model.safetensors`, and since LeRobot 0.4
the processor pipelines `policy_preprocessor.json` / `policy_postprocessor.json` with their state files
(normalisation statistics, tokenizer settings). ACT, Diffusion, SmolVLA, pi0, pi05 ... all load this way
when their files are on disk.

Nothing is downloaded: the Hugging Face hub is offline while a policy loads, so a policy whose constructor
or processor fetches a backbone or a tokenizer (SmolVLA's SmolVLM2, pi0's PaliGemma tokenizer) must find
it in the local HF cache. Whatever is missing becomes a `LeRobotPolicyUnavailable` naming the files and how
to get them onto the machine.

Observation mapping: our batch holds `observation.images.<camera>`; each of the policy's image features
takes one of our cameras (by default the camera of the same name: `observation.images.top` <- `top`,
`observation.image` <- `image`; `camera_map` renames), resized to the feature's shape when it differs.
`observation.state`, any other `observation.*` input and `task` pass through. LeRobot's own processors
normalise, tokenise and unnormalise.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from worldloop.data.features import ACTION, IMAGE_PREFIX, STATE, TASK
from worldloop.vla.policy import Policy

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class LeRobotPolicyUnavailable(FileNotFoundError):
    """A LeRobot policy cannot be loaded offline: files, packages or hub downloads are missing."""


@dataclass
class LeRobotPolicyConfig:
    type: str = "lerobot"
    path: str = ""  # a local directory written by LeRobot's save_pretrained
    # The policy's image feature -> our camera feeding it, e.g. {observation.images.top: front}.
    camera_map: dict[str, str] = field(default_factory=dict)
    # Read from the LeRobot config on loading (evaluation renders these cameras at this size).
    lerobot_type: str = ""
    cameras: tuple[str, ...] = ()
    image_size: tuple[int, int] = (0, 0)
    state_dim: int = 0
    action_dim: int = 0


def default_camera(feature_key: str) -> str:
    """Our camera for a LeRobot image feature: `observation.images.top` -> `top`, `observation.image` -> `image`."""
    if feature_key.startswith(IMAGE_PREFIX):
        return feature_key[len(IMAGE_PREFIX) :]
    return feature_key.rsplit(".", 1)[-1]


class LeRobotPretrainedPolicy(Policy):
    """A LeRobot `PreTrainedPolicy` with its pre/post-processor pipelines."""

    def __init__(self, inner, preprocessor, postprocessor, config: LeRobotPolicyConfig):
        super().__init__()
        self.inner = inner
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.config = config
        lr_cfg = inner.config
        self.n_action_steps = lr_cfg.n_action_steps
        self.action_dim = config.action_dim
        # ACT, SmolVLA, pi0 predict `chunk_size` actions; Diffusion's prediction is its n_action_steps.
        self.chunk_size = getattr(lr_cfg, "chunk_size", None) or lr_cfg.n_action_steps
        self._image_features = dict(lr_cfg.image_features)  # feature key -> PolicyFeature (C, H, W)
        self._feature_camera = {k: config.camera_map.get(k, default_camera(k)) for k in self._image_features}

    def reset(self) -> None:
        self.inner.reset()
        self.preprocessor.reset()
        self.postprocessor.reset()

    def _inputs(self, batch: dict) -> dict:
        """Our batch -> the LeRobot policy's raw inputs (its preprocessor normalises and tokenises)."""
        out: dict = {}
        for key, feature in self._image_features.items():
            ours = IMAGE_PREFIX + self._feature_camera[key]
            if ours not in batch:
                raise KeyError(
                    f"LeRobot policy input {key!r} reads camera {self._feature_camera[key]!r}, but the batch has "
                    f"no {ours!r} (it has {sorted(k for k in batch if k.startswith(IMAGE_PREFIX))}); "
                    f"map it with camera_map={{{key}: <camera>}}"
                )
            image = batch[ours].float()
            size = tuple(feature.shape[-2:])
            if tuple(image.shape[-2:]) != size:
                image = F.interpolate(image, size=size, mode="bilinear", align_corners=False, antialias=True)
            out[key] = image
        for key in self.inner.config.input_features:
            if key in self._image_features:
                continue
            if key not in batch:
                raise KeyError(
                    f"LeRobot policy input {key!r} is missing from the batch (it has {sorted(batch)})"
                )
            value = batch[key].float()
            if key == STATE and value.shape[-1] != self.config.state_dim:
                raise ValueError(
                    f"{STATE}: the LeRobot policy expects {self.config.state_dim} values, the batch has "
                    f"{value.shape[-1]}"
                )
            out[key] = value
        if TASK in batch:
            out[TASK] = list(batch[TASK])
        return out

    def _preprocess(self, batch: dict) -> dict:
        inputs = self.preprocessor(self._inputs(batch))
        # The pipeline's output carries action=None, which Diffusion's observation queues would keep.
        inputs.pop(ACTION, None)
        return inputs

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        inputs = self._preprocess(batch)
        if self.config.lerobot_type == "diffusion":
            inputs = self._observe_for_diffusion(inputs)
        chunk = self.inner.predict_action_chunk(inputs)
        return self.postprocessor(chunk)

    def _observe_for_diffusion(self, inputs: dict) -> dict:
        """Diffusion's predict_action_chunk reads the observation history (n_obs_steps) that only its
        select_action fills, with the cameras stacked under one key: do the same here."""
        from lerobot.policies.utils import populate_queues
        from lerobot.utils.constants import OBS_IMAGES

        inputs = dict(inputs)
        if self._image_features:
            inputs[OBS_IMAGES] = torch.stack([inputs[k] for k in self._image_features], dim=-4)
        self.inner._queues = populate_queues(self.inner._queues, inputs)
        return inputs

    @torch.no_grad()
    def select_action(self, batch: dict) -> torch.Tensor:
        # The LeRobot policy's own queue (and ACT's temporal ensembling), as LeRobot's evaluation runs it.
        return self.postprocessor(self.inner.select_action(self._preprocess(batch)))

    def save_pretrained(self, path: str | Path) -> None:
        """LeRobot's layout again: config.json, model.safetensors and the processor pipelines."""
        path = Path(path)
        self.inner.save_pretrained(path)
        self.preprocessor.save_pretrained(path)
        self.postprocessor.save_pretrained(path)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> LeRobotPretrainedPolicy:
        return load_lerobot_policy(path)


@contextlib.contextmanager
def hub_offline():
    """The Hugging Face hub (and transformers) offline inside the block, whatever the environment says."""
    import huggingface_hub.constants as hub_constants

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    saved_flag = hub_constants.HF_HUB_OFFLINE
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    hub_constants.HF_HUB_OFFLINE = True  # read at import time by huggingface_hub; set it for this block too
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _download_hint(repo_id: str) -> str:
    return (
        f"on a machine with network run `hf download {repo_id} --local-dir <dir>` (or "
        f"`huggingface-cli download ...`), copy <dir> here and pass its path"
    )


def _check_files(path: Path, what: str) -> dict:
    """The parsed config.json of `path`; raises `LeRobotPolicyUnavailable` naming what is missing."""
    if not path.is_dir():
        hint = _download_hint(str(path)) if _HUB_ID.match(str(path)) else "pass the directory LeRobot saved"
        raise LeRobotPolicyUnavailable(
            f"{what}: {path} is not a local directory; nothing is downloaded at run time: {hint}"
        )
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (path / name).is_file()]
    if missing:
        raise LeRobotPolicyUnavailable(
            f"{what}: {path} lacks {', '.join(missing)} (a LeRobot policy directory holds {CONFIG_FILE} "
            f"and {WEIGHTS_FILE}, written by save_pretrained). If the weights are on the Hugging Face hub, "
            f"{_download_hint('<org>/<policy>')}"
        )
    try:
        data = json.loads((path / CONFIG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / CONFIG_FILE}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise ValueError(f"{path / CONFIG_FILE}: expected a LeRobot policy config with a 'type' key")
    return data


def _hub_repos_named(config_data: dict) -> list[str]:
    """Hub repositories a LeRobot config names (backbones, tokenizers), to say what must be in the cache."""
    return sorted(
        {v for v in config_data.values() if isinstance(v, str) and _HUB_ID.match(v) and not Path(v).exists()}
    )


def load_lerobot_policy(
    path: str | Path, device: str = "cpu", camera_map: dict[str, str] | None = None
) -> LeRobotPretrainedPolicy:
    """Load the LeRobot policy saved in directory `path` (offline) and wrap it."""
    path = Path(path)
    data = _check_files(path, "LeRobot policy")
    lerobot_type = data["type"]
    what = f"LeRobot policy {lerobot_type!r} in {path}"
    for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        if not (path / name).is_file():
            raise LeRobotPolicyUnavailable(
                f"{what}: {name} is missing. Checkpoints from LeRobot < 0.4 keep the normalisation inside the "
                f"model; convert them with `python -m lerobot.processor.migrate_policy_normalization "
                f"--pretrained-path {path}`"
            )
    policy_class = None
    try:
        with hub_offline():
            from lerobot.configs.policies import PreTrainedConfig
            from lerobot.policies.factory import get_policy_class, make_pre_post_processors

            policy_class = get_policy_class(lerobot_type)
            lr_cfg = PreTrainedConfig.from_pretrained(path)
            lr_cfg.device = device
            _skip_pretrained_init(lr_cfg)
            inner = policy_class.from_pretrained(path, config=lr_cfg)
            preprocessor, postprocessor = make_pre_post_processors(
                lr_cfg,
                pretrained_path=str(path),
                preprocessor_overrides={"device_processor": {"device": device}},
            )
    except Exception as e:
        missing = [e.name] if isinstance(e, ModuleNotFoundError) else _missing_imports(policy_class)
        if missing:
            raise LeRobotPolicyUnavailable(
                f"{what}: its code needs the Python module(s) {missing}, not installed; install LeRobot's "
                f"extra for this policy type (e.g. pip install 'lerobot[smolvla]' for SmolVLA, "
                f"'lerobot[transformers-dep]' for pi0/pi05)"
            ) from e
        if isinstance(e, (OSError, ValueError)) and _is_hub_error(e):
            first_line = str(e).splitlines()[0] if str(e) else ""
            raise LeRobotPolicyUnavailable(
                f"{what}: loading needs files from the Hugging Face hub that are not on this machine (the hub "
                f"is offline while loading; {type(e).__name__}: {first_line}). Its config names "
                f"{_hub_repos_named(data) or 'no hub repository'}: on a machine with network run "
                f"`hf download <repo>` for each, then copy the HF cache ($HF_HOME, default "
                f"~/.cache/huggingface) to this machine"
            ) from e
        raise

    image_features = dict(lr_cfg.image_features)
    camera_map = dict(camera_map or {})
    unknown = sorted(set(camera_map) - set(image_features))
    if unknown:
        raise ValueError(
            f"{what}: camera_map names {unknown}, not image inputs of the policy {sorted(image_features)}"
        )
    state = lr_cfg.robot_state_feature
    action = lr_cfg.action_feature
    if action is None:
        raise ValueError(f"{path / CONFIG_FILE}: the policy has no 'action' output feature")
    first_image = next(iter(image_features.values()), None)
    config = LeRobotPolicyConfig(
        path=str(path),
        camera_map=camera_map,
        lerobot_type=lerobot_type,
        cameras=tuple(camera_map.get(k, default_camera(k)) for k in image_features),
        image_size=tuple(first_image.shape[-2:]) if first_image is not None else (0, 0),
        state_dim=state.shape[0] if state is not None else 0,
        action_dim=action.shape[0],
    )
    return LeRobotPretrainedPolicy(inner, preprocessor, postprocessor, config).eval()


# Config fields that make a LeRobot policy's constructor fetch initial weights (ACT's torchvision ImageNet
# ResNet, SmolVLA's whole VLM) which model.safetensors then overwrites: off when loading a saved policy.
_PRETRAINED_INIT_OFF = {"pretrained_backbone_weights": None, "load_vlm_weights": False}


def _skip_pretrained_init(lr_cfg) -> None:
    for name, off in _PRETRAINED_INIT_OFF.items():
        if hasattr(lr_cfg, name):
            setattr(lr_cfg, name, off)


def _missing_imports(policy_class) -> list[str]:
    """Top-level modules the policy's modeling code imports that are not installed (LeRobot guards some
    optional imports, e.g. transformers for pi0, so constructing the policy fails with an unrelated error)."""
    if policy_class is None:
        return []
    source = inspect.getsource(sys.modules[policy_class.__module__])
    names = set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", source, flags=re.MULTILINE))
    return sorted(n for n in names if importlib.util.find_spec(n) is None)


def _is_hub_error(e: BaseException) -> bool:
    """A missing hub file under offline mode (huggingface_hub, or transformers re-raising it as OSError)."""
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    if any(isinstance(x, (LocalEntryNotFoundError, OfflineModeIsEnabled)) for x in chain):
        return True
    text = str(e).lower()
    return "huggingface.co" in text or "offline" in text or "cached files" in text
