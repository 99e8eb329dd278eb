"""The MJCF agrees with the embodiment spec, and the closed-form kinematics agree with MuJoCo."""

from __future__ import annotations

import mujoco
import numpy as np

from worldloop import sim  # noqa: F401  (selects the GL backend before MuJoCo renders)
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.sim.kinematics import ArmKinematics
from worldloop.sim.scene import TIP_SITE, build_model


def test_mjcf_joint_and_actuator_limits_match_the_spec():
    model = build_model()
    assert model.nu == TABLETOP_ARM.num_joints
    for i, name in enumerate(TABLETOP_ARM.joint_names):
        joint, actuator = model.joint(name), model.actuator(name)
        assert actuator.id == i and model.actuator_trnid[i, 0] == joint.id
        assert model.jnt_limited[joint.id] and model.actuator_ctrllimited[i]
        expected = [TABLETOP_ARM.position_lower[i], TABLETOP_ARM.position_upper[i]]
        np.testing.assert_allclose(model.jnt_range[joint.id], expected)
        np.testing.assert_allclose(model.actuator_ctrlrange[i], expected)


def test_forward_kinematics_matches_mujoco_and_inverse_round_trips():
    model = build_model()
    data = mujoco.MjData(model)
    kin = ArmKinematics.from_model(model, TABLETOP_ARM)
    rng = np.random.default_rng(0)
    for _ in range(20):
        q = rng.uniform(TABLETOP_ARM.lower(), TABLETOP_ARM.upper())
        data.qpos[:4] = q
        mujoco.mj_kinematics(model, data)
        np.testing.assert_allclose(kin.forward(q), data.site(TIP_SITE).xpos, atol=1e-9)
    for target in ([0.2, 0.1, 0.02], [0.33, -0.2, 0.05], [0.13, 0.0, 0.17]):
        q = kin.inverse(np.array(target))
        assert q is not None and np.all(q >= TABLETOP_ARM.lower()) and np.all(q <= TABLETOP_ARM.upper())
        np.testing.assert_allclose(kin.forward(q), target, atol=1e-9)
    assert kin.inverse(np.array([0.9, 0.0, 0.0])) is None  # out of reach
