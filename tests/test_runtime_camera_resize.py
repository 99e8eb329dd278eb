"""The runtime hands camera frames to the policy at the policy's training size, resized as training was."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldloop.common.embodiment import SO101_ARM
from worldloop.data.features import STATE, image_key
from worldloop.data.images import resize_frames
from worldloop.real_robot.inference import InferenceRequest, PolicyRunner


class SizeCheckingPolicy:
    """Records the batch it is given and, like a trained policy, accepts only its own frame size."""

    def __init__(self, image_size):
        self.config = type("Config", (), {"image_size": image_size})()
        self.seen: dict = {}

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        image = batch[image_key("front")]
        if tuple(image.shape[-2:]) != tuple(self.config.image_size):
            raise RuntimeError(f"policy got {tuple(image.shape)}")
        self.seen = batch
        return torch.zeros(1, 3, SO101_ARM.num_joints)


def camera_frame() -> np.ndarray:
    """640x480 with white 80-column side bands: a centre crop to a square removes exactly them."""
    frame = np.zeros((480, 640, 3), dtype=np.uint8)
    frame[:, :80] = frame[:, -80:] = 255
    frame[:, 80:-80, 0] = 120
    return frame


def observation() -> dict:
    obs = {f"{j}.pos": 1.0 for j in SO101_ARM.joint_names}
    return obs | {"front": camera_frame()}


def test_a_640x480_camera_drives_a_64x64_policy():
    policy = SizeCheckingPolicy((64, 64))
    runner = PolicyRunner(policy, SO101_ARM.joint_names, "pick", use_prefix=False)
    actions = runner(InferenceRequest(observation(), obs_time=0.0))
    assert actions.shape == (3, SO101_ARM.num_joints)
    image = policy.seen[image_key("front")]
    assert image.shape == (1, 3, 64, 64) and image.dtype == torch.float32
    # crop (the default) drops the side bands; the values are those of the training-data path.
    assert torch.allclose(image[0, 0], torch.full((64, 64), 120 / 255)) and image[0, 1].max() == 0
    expected = resize_frames(torch.from_numpy(camera_frame()).permute(2, 0, 1), (64, 64), "crop")
    assert torch.equal(image[0], expected.float() / 255)
    assert policy.seen[STATE].shape == (1, SO101_ARM.num_joints)


def test_stretch_keeps_the_bands_and_off_names_the_camera():
    policy = SizeCheckingPolicy((48, 64))
    stretched = PolicyRunner(policy, SO101_ARM.joint_names, "pick", False, resize="stretch").batch(
        observation()
    )
    image = stretched[image_key("front")][0]
    assert image.shape == (3, 48, 64) and image[1, :, 0].min() > 0.9 and image[1, :, 32].max() == 0
    off = PolicyRunner(policy, SO101_ARM.joint_names, "pick", False, resize="")
    with pytest.raises(ValueError, match=r"camera 'front' gives 480x640 frames but the policy expects 48x64"):
        off.batch(observation())
    with pytest.raises(ValueError, match="resize='squash'"):
        PolicyRunner(policy, SO101_ARM.joint_names, "pick", False, resize="squash")


def test_frames_already_at_size_or_policies_without_a_size_pass_unchanged():
    obs = observation() | {"front": camera_frame()[:64, :64]}
    sized = PolicyRunner(SizeCheckingPolicy((64, 64)), SO101_ARM.joint_names, "pick", False).batch(obs)
    assert torch.equal(sized[image_key("front")][0], torch.from_numpy(obs["front"]).permute(2, 0, 1) / 255.0)
    free = PolicyRunner(object(), SO101_ARM.joint_names, "pick", False).batch(observation())
    assert free[image_key("front")].shape == (1, 3, 480, 640)
