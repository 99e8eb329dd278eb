"""Closed-loop evaluation of a policy in LeRobot's own gym envs (gym-pusht, gym-aloha, ...) or any gymnasium
env with image observations, summarised like the sim backend (success with a Wilson 95% interval, mean
progress, videos) plus LeRobot's own episode metrics (max and summed reward), so that results can be set
next to published LeRobot numbers.

The env comes from a LeRobot env preset (`lerobot.envs.configs`, e.g. `pusht`, `aloha`: gym id, package,
kwargs) or from a plain gymnasium id. Presets whose suites LeRobot builds by its own code rather than one
`gym.make` (LIBERO, Meta-World) are not supported. Observation mapping: image observations (uint8 HxWx3; nested keys joined with
'/', e.g. `pixels/top`) feed the policy's cameras, `state_key` feeds `observation.state`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from worldloop.data.features import STATE, TASK, image_key
from worldloop.data.images import resize_frames
from worldloop.vla.episode_runner import closing_all, run_episodes, success_summary
from worldloop.vla.policy import Policy


@dataclass
class LeRobotEnvEvalConfig:
    type: str = "pusht"  # a LeRobot env preset (lerobot.envs.configs: pusht, aloha, ...); "" for gym_id alone
    gym_id: str = ""  # a gymnasium id; replaces the preset's (e.g. gym_pusht/PushT-v0)
    package: str = ""  # module imported to register gym_id (default: the preset's gym_<type>)
    # Env image observation -> the policy camera it feeds, e.g. {pixels: image}; default: a single env image
    # feeds a single-camera policy.
    cameras: dict[str, str] = field(default_factory=dict)
    state_key: str = "agent_pos"  # env observation fed as observation.state
    task: str = ""  # the instruction given to the policy (default: the gym id)
    max_steps: int = 0  # env steps per episode; 0 keeps the env's own limit
    batch_envs: int = 10  # envs stepped together, one batched policy call per step
    videos: int = 4  # episodes recorded as mp4 (policy cameras side by side); 0 for none
    success_key: str = "is_success"  # info flag of a successful episode
    progress_key: str = ""  # info value in [0, 1] whose last value is the progress; "" uses the max reward
    # How env images of another size than the policy's `image_size` reach it: crop (centre-crop to its
    # aspect ratio, then resize) | stretch | "" (an error): as the policy's training data was resized.
    resize: str = "crop"


@dataclass
class _EnvSpec:
    gym_id: str
    package: str
    kwargs: dict


def env_spec(cfg: LeRobotEnvEvalConfig) -> _EnvSpec:
    """The gymnasium id, the package registering it and the make() kwargs for `cfg`."""
    if not cfg.type:
        if not cfg.gym_id:
            raise ValueError("lerobot_env: give --env.type (a LeRobot env preset) or --env.gym_id")
        return _EnvSpec(cfg.gym_id, cfg.package, {})
    from lerobot.envs.configs import EnvConfig

    known = sorted(EnvConfig.get_known_choices())
    if cfg.type not in known:
        raise ValueError(f"--env.type={cfg.type!r} is not a LeRobot env preset; expected one of {known}")
    preset = EnvConfig.get_choice_class(cfg.type)()
    return _EnvSpec(cfg.gym_id or preset.gym_id, cfg.package or preset.package_name, dict(preset.gym_kwargs))


def make_env(spec: _EnvSpec, max_steps: int):
    import gymnasium as gym

    if spec.package:
        try:
            importlib.import_module(spec.package)  # registers its env ids
        except ModuleNotFoundError as e:
            dist = spec.package.replace("_", "-")
            raise ModuleNotFoundError(
                f"env {spec.gym_id!r} needs the package {spec.package!r} (pip install {dist}; for pusht: "
                f"pip install 'worldloop[pusht]')"
            ) from e
    kwargs = dict(spec.kwargs)
    if max_steps > 0:
        kwargs["max_episode_steps"] = max_steps
    try:
        return gym.make(spec.gym_id, disable_env_checker=True, **kwargs)
    except gym.error.Error as e:
        raise ValueError(f"gym.make({spec.gym_id!r}) failed: {e}") from e


def _flatten(obs: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in obs.items():
        if isinstance(value, dict):
            out |= _flatten(value, f"{prefix}{key}/")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _is_image(value) -> bool:
    return (
        isinstance(value, np.ndarray) and value.dtype == np.uint8 and value.ndim == 3 and value.shape[-1] == 3
    )


def camera_mapping(cfg: LeRobotEnvEvalConfig, observation: dict, policy_cameras: tuple[str, ...]) -> dict:
    """Env image key -> policy camera, checked against one observation of the env."""
    flat = _flatten(observation)
    images = sorted(k for k, v in flat.items() if _is_image(v))
    mapping = dict(cfg.cameras)
    if not mapping:
        if len(images) != 1 or len(policy_cameras) != 1:
            raise ValueError(
                f"lerobot_env: the env has image observations {images} and the policy reads cameras "
                f"{list(policy_cameras)}; say which feeds which with --env.cameras='{{<env key>: <camera>}}'"
            )
        mapping = {images[0]: policy_cameras[0]}
    unknown = sorted(set(mapping) - set(images))
    if unknown:
        raise ValueError(f"--env.cameras names {unknown}, not image observations of the env ({images})")
    unfed = sorted(set(policy_cameras) - set(mapping.values()))
    if unfed:
        raise ValueError(
            f"--env.cameras feeds no env image to the policy cameras {unfed} (mapping: {mapping})"
        )
    if cfg.state_key not in flat:
        raise ValueError(
            f"--env.state_key={cfg.state_key!r} is not an env observation (it has {sorted(flat)})"
        )
    return mapping


def _policy_batch(
    observations: list[dict], mapping: dict, cfg: LeRobotEnvEvalConfig, task: str, size, device
) -> dict:
    """The policy's batch; images resized to `size` ([H, W] the policy reads, None: as rendered)."""
    flat = [_flatten(o) for o in observations]
    batch = {}
    for key, camera in mapping.items():
        images = torch.from_numpy(np.stack([f[key] for f in flat])).permute(0, 3, 1, 2)
        if size is not None and tuple(images.shape[-2:]) != size:
            if not cfg.resize:
                raise ValueError(
                    f"env image {key!r} is {images.shape[-2]}x{images.shape[-1]} but the policy reads "
                    f"{size[0]}x{size[1]} and --env.resize is off: set it to crop or stretch"
                )
            images = resize_frames(images, size, cfg.resize)
        batch[image_key(camera)] = images.to(device).float().div_(255.0)
    batch[STATE] = torch.from_numpy(np.stack([np.asarray(f[cfg.state_key]) for f in flat])).to(device).float()
    batch[TASK] = [task] * len(observations)
    return batch


@dataclass
class _LeRobotEpisodes:
    """`EpisodeAdapter` of a LeRobot gym env: success from an info flag, progress from an info value or the
    max reward, plus LeRobot's max and summed reward."""

    cfg: LeRobotEnvEvalConfig
    mapping: dict
    task: str
    size: tuple[int, int] | None  # [H, W] the policy reads, or None when it declares none
    device: str | torch.device

    def first_record(self, seed: int, reset_info: dict) -> dict:
        return {
            "seed": seed,
            "success": False,
            "progress": 0.0,
            "max_reward": -np.inf,
            "sum_reward": 0.0,
            "length": 0,
        }

    def policy_batch(self, observations: list[dict], records: list[dict]) -> dict:
        return _policy_batch(observations, self.mapping, self.cfg, self.task, self.size, self.device)

    def update(self, record: dict, reward: float, info: dict) -> None:
        record["sum_reward"] += reward
        record["max_reward"] = max(record["max_reward"], reward)
        record["success"] = record["success"] or bool(info.get(self.cfg.success_key, False))
        if self.cfg.progress_key:
            record["progress"] = float(info.get(self.cfg.progress_key, record["progress"]))
        else:
            record["progress"] = record["max_reward"]

    def video_frame(self, observation: dict) -> np.ndarray:
        flat = _flatten(observation)
        return np.concatenate([flat[key] for key in self.mapping], axis=1)


def _image_size(policy: Policy) -> tuple[int, int] | None:
    """The [H, W] a policy was trained at (`config.image_size`; LeRobot's own policies declare none)."""
    size = tuple(getattr(policy.config, "image_size", ()) or ())
    return (int(size[0]), int(size[1])) if len(size) == 2 and all(size) else None


def first_observations(
    cfg: LeRobotEnvEvalConfig, seeds: list[int], cameras: tuple[str, ...]
) -> tuple[list[dict], str]:
    """The env's reset observation for each seed (what `evaluate_in_lerobot_env` with the same seeds starts
    from; nothing is stepped), keyed as a dataset frame: `observation.images.<camera>` (uint8 HxWx3, fed to
    `cameras` as `cfg.cameras` maps them) and `observation.state`; and the instruction its episodes get."""
    spec = env_spec(cfg)
    env = make_env(spec, cfg.max_steps)
    try:
        observations, mapping = [], None
        for seed in seeds:
            flat = _flatten(env.reset(seed=int(seed))[0])
            mapping = mapping or camera_mapping(cfg, flat, cameras)
            frame = {image_key(camera): flat[key] for key, camera in mapping.items()}
            frame[STATE] = np.asarray(flat[cfg.state_key], dtype=np.float32)
            observations.append(frame)
    finally:
        env.close()
    return observations, cfg.task or spec.gym_id


def evaluate_in_lerobot_env(
    policy: Policy,
    cfg: LeRobotEnvEvalConfig,
    episodes: int,
    seed: int,
    video_dir: str | Path | None = None,
    device: str | torch.device = "cpu",
    progress_bar: bool = True,
) -> dict:
    """Run `episodes` episodes (env seeds seed, seed+1, ...) and return the summary (same keys as the sim
    backend's, plus `mean_max_reward` and `mean_sum_reward`)."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    spec = env_spec(cfg)
    n_envs = min(cfg.batch_envs, episodes)
    with closing_all([make_env(spec, cfg.max_steps) for _ in range(n_envs)]) as envs:
        action_shape = envs[0].action_space.shape
        if action_shape != (policy.action_dim,):
            raise ValueError(
                f"env {spec.gym_id!r} takes actions of shape {action_shape}; the policy gives {policy.action_dim}"
            )
        mapping = camera_mapping(cfg, envs[0].reset(seed=seed)[0], tuple(policy.config.cameras))
        task = cfg.task or spec.gym_id
        results, seconds = run_episodes(
            policy,
            envs,
            _LeRobotEpisodes(cfg, mapping, task, _image_size(policy), device),
            episodes,
            seed,
            cfg.videos,
            video_dir,
            desc=f"eval {spec.gym_id}",
            progress_bar=progress_bar,
        )
    return {
        "backend": "lerobot_env",
        "env_type": cfg.type,
        "gym_id": spec.gym_id,
        "task": task,
        **success_summary(results),
        "mean_max_reward": float(np.mean([r["max_reward"] for r in results])),
        "mean_sum_reward": float(np.mean([r["sum_reward"] for r in results])),
        "mean_length": float(np.mean([r["length"] for r in results])),
        "seed": seed,
        "max_steps": cfg.max_steps,
        "seconds": seconds,
        "per_episode": results,
    }
