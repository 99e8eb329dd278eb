"""Names and shapes of the episode-data features: the contract between sim, data, models and runtime.

Datasets are LeRobotDataset v3; these are the keys every part of worldloop reads and writes.
"""

from __future__ import annotations

IMAGE_PREFIX = "observation.images."
STATE = "observation.state"
# Where the objects are (the sim's truth, e.g. each cube's centre): recorded for metrics such as object
# tracking in drawn frames, never read by a policy or the world model.
ENVIRONMENT_STATE = "observation.environment_state"
ACTION = "action"
TASK = "task"
REWARD = "next.reward"
SUCCESS = "next.success"
DONE = "next.done"

DEFAULT_CAMERAS = ("front", "wrist")


def image_key(camera: str) -> str:
    return f"{IMAGE_PREFIX}{camera}"


def camera_of(key: str) -> str:
    if not key.startswith(IMAGE_PREFIX):
        raise ValueError(f"{key!r} is not an image feature (expected a key starting with {IMAGE_PREFIX!r})")
    return key[len(IMAGE_PREFIX) :]


def lerobot_features(
    joint_names: tuple[str, ...],
    cameras: tuple[str, ...],
    image_size: tuple[int, int],
    environment_state_names: tuple[str, ...] = (),
) -> dict[str, dict]:
    """The `features` dict for `LeRobotDataset.create` (images stored as uint8 HxWx3); with
    `environment_state_names`, an `observation.environment_state` float32 vector of that many values."""
    h, w = image_size
    n = len(joint_names)
    features: dict[str, dict] = {
        image_key(cam): {"dtype": "image", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
        for cam in cameras
    }
    features[STATE] = {"dtype": "float32", "shape": (n,), "names": list(joint_names)}
    if environment_state_names:
        names = list(environment_state_names)
        features[ENVIRONMENT_STATE] = {"dtype": "float32", "shape": (len(names),), "names": names}
    features[ACTION] = {"dtype": "float32", "shape": (n,), "names": list(joint_names)}
    features[REWARD] = {"dtype": "float32", "shape": (1,), "names": None}
    features[SUCCESS] = {"dtype": "bool", "shape": (1,), "names": None}
    features[DONE] = {"dtype": "bool", "shape": (1,), "names": None}
    return features
