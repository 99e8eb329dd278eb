"""The tabletop simulator core shared by the gymnasium env and the robot-facing `SimRobot`.

It owns the MuJoCo model/data and the camera renderer, places objects, and drives the arm like a
position-controlled servo: the commanded joint target is clipped to the position limits and the actuator
set-point moves towards it no faster than the velocity limits, one physics step at a time.
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec
from worldloop.sim.kinematics import ArmKinematics
from worldloop.sim.rendering import CameraRenderer, project_to_pixels
from worldloop.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE, TIP_SITE, ZONE_COLORS, build_model
from worldloop.sim.tasks import Layout, SceneState

# Where the tip rests before an episode: above the near workspace, out of the way of the cubes.
HOME_TIP = np.array([0.13, 0.0, 0.17])


class TabletopSim:
    def __init__(
        self,
        cameras: tuple[str, ...] = ("front", "wrist"),
        image_size: int = 64,
        embodiment: EmbodimentSpec = TABLETOP_ARM,
    ):
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
        self.embodiment = embodiment
        self.model = build_model(embodiment)
        self.data = mujoco.MjData(self.model)
        self.kinematics = ArmKinematics.from_model(self.model, embodiment)
        home = self.kinematics.inverse(HOME_TIP)
        if home is None:
            raise ValueError(f"HOME_TIP {HOME_TIP} is out of reach of embodiment {embodiment.name!r}")
        self.home = home
        self._lower, self._upper = embodiment.lower(), embodiment.upper()
        self._max_velocity = embodiment.max_velocity()
        names = embodiment.joint_names
        self._qpos_idx = np.array([self.model.joint(n).qposadr[0] for n in names])
        self._act_idx = np.array([self.model.actuator(n).id for n in names])
        self._cube_qpos = {c: self.model.joint(f"cube_{c}").qposadr[0] for c in CUBE_COLORS}
        self._zone_mocap = {c: self.model.body(f"zone_{c}").mocapid[0] for c in ZONE_COLORS}
        self.target = home.copy()  # the commanded joint-position target (after clipping)
        self.cameras = tuple(cameras)
        self.image_size = image_size
        self._renderer = CameraRenderer(self.model, self.cameras, image_size, image_size) if cameras else None

    @property
    def timestep(self) -> float:
        return float(self.model.opt.timestep)

    def substeps(self, duration: float) -> int:
        """Physics steps in `duration` seconds; the duration must be a whole number of physics steps."""
        n = duration / self.timestep
        if n < 1 or abs(n - round(n)) > 1e-6:
            raise ValueError(
                f"a control period of {duration:.6g} s is not a whole number of physics steps "
                f"({self.timestep} s); choose a rate that divides {1 / self.timestep:.0f} Hz"
            )
        return round(n)

    def reset(self, layout: Layout, arm_q: np.ndarray) -> None:
        mujoco.mj_resetData(self.model, self.data)
        arm_q = np.clip(arm_q, self._lower, self._upper)
        self.data.qpos[self._qpos_idx] = arm_q
        self.data.ctrl[self._act_idx] = arm_q
        self.target = arm_q.copy()
        for colour, xy in layout.cubes.items():
            adr = self._cube_qpos[colour]
            yaw = layout.cube_yaws[colour]
            self.data.qpos[adr : adr + 3] = (xy[0], xy[1], CUBE_HALF_SIZE)
            self.data.qpos[adr + 3 : adr + 7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
        for colour, xy in layout.zones.items():
            self.data.mocap_pos[self._zone_mocap[colour]] = (xy[0], xy[1], 0.001)
        mujoco.mj_forward(self.model, self.data)

    def set_target(self, q: np.ndarray) -> np.ndarray:
        """Command absolute joint positions; returns the target actually used (clipped to the limits)."""
        self.target = self.embodiment.clip_target(q)
        return self.target.copy()

    def advance(self, duration: float) -> None:
        """Run physics for `duration` s, moving the servo set-point towards the target within velocity limits."""
        n = self.substeps(duration)
        start = self.data.ctrl[self._act_idx]
        reach = np.arange(1, n + 1)[:, None] * (self._max_velocity * self.timestep)
        for ctrl in start + np.clip(self.target - start, -reach, reach):  # the set-point ramp, per step
            self.data.ctrl[self._act_idx] = ctrl
            mujoco.mj_step(self.model, self.data)

    def joint_positions(self) -> np.ndarray:
        return self.data.qpos[self._qpos_idx].copy()

    def scene_state(self) -> SceneState:
        return SceneState(
            tip=self.data.site(TIP_SITE).xpos.copy(),
            cubes={c: self.data.qpos[a : a + 3].copy() for c, a in self._cube_qpos.items()},
            zones={c: self.data.mocap_pos[m, :2].copy() for c, m in self._zone_mocap.items()},
        )

    def set_cube_position(self, colour: str, xyz: np.ndarray) -> None:
        """Teleport a cube (tests and scripted set-ups)."""
        adr = self._cube_qpos[colour]
        self.data.qpos[adr : adr + 3] = xyz
        mujoco.mj_forward(self.model, self.data)

    def cube_colour(self, colour: str) -> np.ndarray:
        """The cube's RGB as the MJCF gives it, in [0, 1] (what object tracking looks for in frames)."""
        return self.model.geom(f"cube_{colour}").rgba[:3].copy()

    def zone_colour(self, colour: str) -> np.ndarray:
        """The target square's RGB as the MJCF gives it, in [0, 1]."""
        return self.model.geom(f"zone_{colour}").rgba[:3].copy()

    def project(self, camera: str, points: np.ndarray) -> np.ndarray:
        """World points [..., 3] -> (x, y) pixels [..., 2] in `camera`'s frames at this sim's image size (see
        `rendering.project_to_pixels`), with the camera where the current state puts it."""
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_comPos(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)
        return project_to_pixels(self.model, self.data, camera, points, self.image_size, self.image_size)

    def render(self) -> dict[str, np.ndarray]:
        if self._renderer is None:
            raise RuntimeError("this TabletopSim was built without cameras")
        return self._renderer.render(self.data)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
