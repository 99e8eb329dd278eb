"""Headless camera rendering for the MuJoCo scenes: EGL when available, OSMesa as the fallback.

MuJoCo picks its OpenGL backend from `MUJOCO_GL` when it is first imported, so `select_gl_backend()` must
run before `import mujoco` (the `sim` package does it on import). A backend the user chose is kept.
"""

from __future__ import annotations

import ctypes.util
import os

import numpy as np


def select_gl_backend() -> str:
    """Set MUJOCO_GL / PYOPENGL_PLATFORM for headless rendering unless the user already chose."""
    if "MUJOCO_GL" not in os.environ:
        os.environ["MUJOCO_GL"] = "egl" if ctypes.util.find_library("EGL") else "osmesa"
    backend = os.environ["MUJOCO_GL"]
    if backend in ("egl", "osmesa"):
        os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend


class CameraRenderer:
    """Renders named cameras of one model at one size into uint8 HxWx3 arrays; close() frees the context."""

    def __init__(self, model, cameras: tuple[str, ...], height: int, width: int):
        import mujoco

        missing = [c for c in cameras if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0]
        if missing:
            raise ValueError(f"unknown camera(s) {missing}; the model has {camera_names(model)}")
        if height > model.vis.global_.offheight or width > model.vis.global_.offwidth:
            # The offscreen buffer bounds the image size; grow it rather than fail.
            model.vis.global_.offheight = max(height, model.vis.global_.offheight)
            model.vis.global_.offwidth = max(width, model.vis.global_.offwidth)
        self.cameras = tuple(cameras)
        self._renderer = mujoco.Renderer(model, height=height, width=width)

    def render(self, data) -> dict[str, np.ndarray]:
        frames = {}
        for cam in self.cameras:
            self._renderer.update_scene(data, camera=cam)
            frames[cam] = self._renderer.render()
        return frames

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


def camera_names(model) -> list[str]:
    import mujoco

    return [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam)]


def project_to_pixels(model, data, camera: str, points: np.ndarray, height: int, width: int) -> np.ndarray:
    """Where world points [..., 3] land in `camera`'s image of height x width (the pinhole model MuJoCo
    renders with, at the camera pose in `data`, which must be forwarded): [..., 2] as (x, y) pixel
    coordinates, x along columns and y down rows, pixel (i, j)'s centre at (j + 0.5, i + 0.5)."""
    import mujoco

    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if cam < 0:
        raise ValueError(f"unknown camera {camera!r}; the model has {camera_names(model)}")
    points = np.asarray(points, dtype=np.float64)
    if points.shape[-1] != 3:
        raise ValueError(f"points: expected [..., 3] world positions, got shape {list(points.shape)}")
    # Camera frame: x right, y up, looking along -z (cam_xmat's columns are those axes in world frame).
    rotation = data.cam_xmat[cam].reshape(3, 3)
    local = (points - data.cam_xpos[cam]) @ rotation
    depth = -local[..., 2]
    if np.any(depth <= 0):
        raise ValueError(f"some points lie behind camera {camera!r}; they have no pixel")
    focal = 0.5 * height / np.tan(np.deg2rad(model.cam_fovy[cam]) / 2)
    x = width / 2 + focal * local[..., 0] / depth
    y = height / 2 - focal * local[..., 1] / depth
    return np.stack([x, y], -1)
