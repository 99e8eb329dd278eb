"""The tabletop simulator on genesis-world: a drop-in for `TabletopSim` (same methods, state and images).

The arm comes from our own MJCF (`sim/assets/tabletop.xml` with the embodiment's limits written in by
`build_spec`), loaded by Genesis' MJCF importer. Genesis reads an MJCF as one entity and has no per-body
`gravcomp`, so the scene is split: the arm alone is one entity with gravity compensation, and the table,
cubes and target squares are Genesis primitives sized, coloured and weighted from the compiled MuJoCo model.
The cameras are placed from the MJCF's cameras (the wrist camera rides on the hand link). The servo is the
same as MuJoCo's: the PD set-point ramps towards the clipped target within the velocity limits, one
physics step at a time, with the position actuators' gains and force range. Known differences: Genesis
raises the contact time constant to 2 physics steps (0.01 s, MJCF 0.005 s), and its rasteriser lights the
scene a little differently (benchmarks/sim_backends.py measures expert and policy parity).

Genesis runs on `gs.cpu` (or `gs.gpu` when CUDA is available). It is initialised once per process; its first
scene build compiles kernels (minutes on a CPU; cached on disk for later processes).
"""

from __future__ import annotations

import math

import mujoco
import numpy as np

from worldloop.common.embodiment import TABLETOP_ARM, EmbodimentSpec
from worldloop.sim.kinematics import ArmKinematics
from worldloop.sim.scene import CUBE_COLORS, CUBE_HALF_SIZE, TIP_SITE, ZONE_COLORS, build_spec
from worldloop.sim.tabletop_sim import HOME_TIP
from worldloop.sim.tasks import Layout, SceneState

INSTALL_HINT = "pip install 'worldloop[genesis]'"
ARM_ROOT_BODY = "base"  # the MJCF body holding the whole arm; everything else becomes a Genesis primitive
ZONE_THICKNESS = 0.002  # m, the squares are flat visual markers (no collision), as in the MJCF


def import_genesis():
    """The `genesis` module, initialised once for this process; a clear error when it is not installed."""
    try:
        import genesis as gs
    except ImportError as e:
        raise ImportError(
            f"the Genesis backend (--sim.backend=genesis) needs genesis-world, which is not installed: "
            f"{INSTALL_HINT}"
        ) from e
    if not gs._initialized:
        import torch

        gs.init(
            backend=gs.gpu if torch.cuda.is_available() else gs.cpu,
            precision="32",
            logging_level="warning",
            seed=0,
        )
    return gs


def arm_mjcf(embodiment: EmbodimentSpec) -> str:
    """Our MJCF with only the arm left in it (plus its actuators), as XML text for Genesis' importer."""
    spec = build_spec(embodiment)
    for body in list(spec.worldbody.bodies):
        if body.name != ARM_ROOT_BODY:
            spec.delete(body)
    for element in [*spec.worldbody.geoms, *spec.worldbody.cameras, *spec.worldbody.lights]:
        spec.delete(element)
    return spec.to_xml()


def _camera_offset(model: mujoco.MjModel, camera: str) -> np.ndarray:
    """4x4 pose of a body-fixed MJCF camera in its body's frame (both use the -z forward, +y up convention)."""
    cam = model.camera(camera)
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, cam.quat)
    offset = np.eye(4)
    offset[:3, :3] = rot.reshape(3, 3)
    offset[:3, 3] = cam.pos
    return offset


class GenesisTabletopSim:
    """`TabletopSim`'s interface on a Genesis scene (see sim/tabletop_sim.py for the contract)."""

    def __init__(
        self,
        cameras: tuple[str, ...] = ("front", "wrist"),
        image_size: int = 64,
        embodiment: EmbodimentSpec = TABLETOP_ARM,
    ):
        if image_size < 8:
            raise ValueError(f"image_size must be at least 8 pixels, got {image_size}")
        gs = import_genesis()
        self.embodiment = embodiment
        # The MuJoCo model is the reference for every dimension, colour, mass and camera below.
        mj = build_spec(embodiment).compile()
        unknown = [c for c in cameras if mujoco.mj_name2id(mj, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0]
        if unknown:
            names = [mj.camera(i).name for i in range(mj.ncam)]
            raise ValueError(f"unknown camera(s) {unknown}; the model has {names}")
        self.kinematics = ArmKinematics.from_model(mj, embodiment)
        home = self.kinematics.inverse(HOME_TIP)
        if home is None:
            raise ValueError(f"HOME_TIP {HOME_TIP} is out of reach of embodiment {embodiment.name!r}")
        self.home = home
        self._timestep = float(mj.opt.timestep)
        self._lower, self._upper = embodiment.lower(), embodiment.upper()
        self._max_velocity = embodiment.max_velocity()
        self.target = home.copy()
        self.cameras = tuple(cameras)
        self.image_size = image_size

        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=self._timestep, substeps=1),
            rigid_options=gs.options.RigidOptions(
                dt=self._timestep,
                integrator=gs.integrator.implicitfast,
                # The MJCF's contact model: elliptic cones, impratio 10, torsional friction (cubes' condim=4).
                friction_cone=gs.friction_cone.elliptic,
                impratio=float(mj.opt.impratio),
                enable_torsional_friction=True,
                enable_self_collision=False,  # in the MJCF only the finger touches anything
            ),
            vis_options=gs.options.VisOptions(
                shadow=False,
                plane_reflection=False,
                show_world_frame=False,
                ambient_light=tuple(mj.vis.headlight.ambient),
                background_color=tuple(float(c) for c in mj.vis.rgba.haze[:3]),
                # One top light stands in for the MJCF's top light and camera headlight; its intensity matches
                # the front camera's mean brightness to ~3/255 (the wrist view stays ~20/255 darker: Genesis has
                # no light that follows a camera).
                lights=[
                    {
                        "type": "directional",
                        "dir": (0.0, 0.0, -1.0),
                        "color": (1.0, 1.0, 1.0),
                        "intensity": 3.0,
                    }
                ],
            ),
            renderer=gs.renderers.Rasterizer(),
            show_viewer=False,
        )
        table = mj.geom("table")
        self.scene.add_entity(
            gs.morphs.Plane(pos=tuple(table.pos)),
            material=gs.materials.Rigid(
                friction=float(table.friction[0]), friction_torsional=float(table.friction[1])
            ),
            surface=gs.surfaces.Rough(color=tuple(table.rgba[:3])),
        )
        self.arm = self.scene.add_entity(
            gs.morphs.MJCF(file=arm_mjcf(embodiment), convexify=False),
            material=gs.materials.Rigid(gravity_compensation=1.0),  # the MJCF's gravcomp="1" on every link
        )
        self.cubes = {}
        for colour in CUBE_COLORS:
            geom = mj.geom(f"cube_{colour}")
            volume = float(np.prod(2 * geom.size))
            self.cubes[colour] = self.scene.add_entity(
                gs.morphs.Box(size=tuple(2 * geom.size), pos=(0.0, 0.0, CUBE_HALF_SIZE)),
                material=gs.materials.Rigid(
                    rho=float(mj.body(f"cube_{colour}").mass[0]) / volume,
                    friction=float(geom.friction[0]),
                    friction_torsional=float(geom.friction[1]),
                ),
                surface=gs.surfaces.Rough(color=tuple(geom.rgba[:3])),
            )
        self.zones = {}
        self._zone_xy = {}
        for colour in ZONE_COLORS:
            geom = mj.geom(f"zone_{colour}")
            self.zones[colour] = self.scene.add_entity(
                gs.morphs.Box(
                    size=(2 * geom.size[0], 2 * geom.size[1], ZONE_THICKNESS),
                    pos=(0.0, 0.0, ZONE_THICKNESS / 2),
                    fixed=True,
                    collision=False,
                ),
                surface=gs.surfaces.Rough(color=tuple(geom.rgba[:3])),
            )
            self._zone_xy[colour] = np.array(mj.body(f"zone_{colour}").pos[:2], dtype=np.float64)
        self._cameras = {}
        for cam in self.cameras:
            params = mj.camera(cam)
            fovy = float(params.fovy[0])
            if cam == "front":  # a `targetbody` camera: fixed position, looking at the workspace centre
                lookat = tuple(mj.body(mj.cam_targetbodyid[params.id]).pos)
                self._cameras[cam] = self.scene.add_camera(
                    res=(image_size, image_size), pos=tuple(params.pos), lookat=lookat, fov=fovy, GUI=False
                )
            else:
                self._cameras[cam] = self.scene.add_camera(
                    res=(image_size, image_size), fov=fovy, near=0.01, GUI=False
                )
        self.scene.build()

        names = embodiment.joint_names
        self._dofs = [self.arm.get_joint(n).dofs_idx_local[0] for n in names]
        self._hand = self.arm.get_link("hand")
        self._tip_offset = np.array(mj.site(TIP_SITE).pos, dtype=np.float64)
        for cam, camera in self._cameras.items():
            if cam != "front":
                body = mj.body(mj.cam_bodyid[mj.camera(cam).id]).name
                camera.attach(self.arm.get_link(body), _camera_offset(mj, cam))
        self._ctrl = home.copy()  # the servo set-point

    @property
    def timestep(self) -> float:
        return self._timestep

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
        self.scene.reset()
        arm_q = np.clip(arm_q, self._lower, self._upper)
        self.arm.set_dofs_position(arm_q, self._dofs, zero_velocity=True)
        self.arm.control_dofs_position(arm_q, self._dofs)
        self._ctrl = arm_q.copy()
        self.target = arm_q.copy()
        for colour, xy in layout.cubes.items():
            yaw = layout.cube_yaws[colour]
            self.cubes[colour].set_pos((xy[0], xy[1], CUBE_HALF_SIZE), zero_velocity=True)
            self.cubes[colour].set_quat((math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)), zero_velocity=True)
        for colour, xy in layout.zones.items():
            self.zones[colour].set_pos((xy[0], xy[1], ZONE_THICKNESS / 2))
            self._zone_xy[colour] = np.asarray(xy, dtype=np.float64).copy()

    def set_target(self, q: np.ndarray) -> np.ndarray:
        """Command absolute joint positions; returns the target actually used (clipped to the limits)."""
        self.target = self.embodiment.clip_target(q)
        return self.target.copy()

    def advance(self, duration: float) -> None:
        """Run physics for `duration` s, moving the servo set-point towards the target within velocity limits."""
        n = self.substeps(duration)
        start = self._ctrl
        reach = np.arange(1, n + 1)[:, None] * (self._max_velocity * self.timestep)
        for ctrl in start + np.clip(self.target - start, -reach, reach):
            self.arm.control_dofs_position(ctrl, self._dofs)
            self.scene.step()
        self._ctrl = ctrl.copy()

    def joint_positions(self) -> np.ndarray:
        return _numpy(self.arm.get_dofs_position(self._dofs))

    def _tip(self) -> np.ndarray:
        pos, quat = _numpy(self._hand.get_pos()), _numpy(self._hand.get_quat())
        rot = np.zeros(9)
        mujoco.mju_quat2Mat(rot, quat)
        return pos + rot.reshape(3, 3) @ self._tip_offset

    def scene_state(self) -> SceneState:
        return SceneState(
            tip=self._tip(),
            cubes={c: _numpy(e.get_pos()) for c, e in self.cubes.items()},
            zones={c: xy.copy() for c, xy in self._zone_xy.items()},
        )

    def set_cube_position(self, colour: str, xyz: np.ndarray) -> None:
        """Teleport a cube (tests and scripted set-ups)."""
        self.cubes[colour].set_pos(tuple(float(v) for v in xyz), zero_velocity=True)

    def render(self) -> dict[str, np.ndarray]:
        if not self.cameras:
            raise RuntimeError("this GenesisTabletopSim was built without cameras")
        frames = {}
        for cam, camera in self._cameras.items():
            if cam != "front":
                camera.move_to_attach()
            rgb = camera.render(rgb=True)[0]
            frames[cam] = np.ascontiguousarray(_numpy(rgb), dtype=np.uint8)
        return frames

    def close(self) -> None:
        if self.scene is not None:
            self.scene.destroy()
            self.scene = None


def _numpy(x) -> np.ndarray:
    """A float64 (or image) numpy copy of a Genesis tensor or array."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    return x.astype(np.float64) if x.dtype.kind == "f" else x.copy()
