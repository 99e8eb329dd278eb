"""Safety layer and watchdog: limits hold for any target stream, bad actions are rejected with a reason."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.safety import SafetyConfig, SafetyLimiter
from worldloop.real_robot.watchdog import Watchdog

SPEC = TABLETOP_ARM
DT = 0.01
D = SPEC.num_joints

targets = st.one_of(
    st.lists(st.floats(-5.0, 5.0), min_size=D, max_size=D),  # in and far out of range, big jumps
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=D, max_size=D),
    st.none(),  # brake to a hold
)


def _assert_within_limits(start: np.ndarray, commands: np.ndarray, limit_scale: float = 1.0):
    path = np.vstack([start, commands])
    assert np.all(path >= SPEC.lower() - 1e-12) and np.all(path <= SPEC.upper() + 1e-12)
    velocity = np.diff(path, axis=0) / DT
    assert np.all(np.abs(velocity) <= limit_scale * SPEC.max_velocity() * (1 + 1e-9) + 1e-9)
    accel = np.diff(np.vstack([np.zeros(D), velocity]), axis=0) / DT
    assert np.all(np.abs(accel) <= limit_scale * SPEC.max_acceleration() * (1 + 1e-6) + 1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(targets, min_size=1, max_size=200), st.floats(0.0, 1.0), st.sampled_from([1.0, 0.5]))
def test_limits_are_never_exceeded_whatever_the_targets(stream, where, scale):
    start = SPEC.lower() + where * (SPEC.upper() - SPEC.lower())
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(limit_scale=scale))
    limiter.reset(start)
    commands = np.array([limiter.filter(t) for t in stream])
    _assert_within_limits(start, commands, scale)


def test_nan_and_out_of_range_targets_are_rejected_with_a_logged_reason(caplog):
    limiter = SafetyLimiter(SPEC, DT)
    limiter.reset(np.zeros(D))
    with caplog.at_level(logging.WARNING, logger="worldloop.real_robot.safety"):
        held = limiter.filter([np.nan, 0, 0, 0])
        limiter.filter([0.0, 0.0, 9.0, 0.0])
        limiter.filter([0.0, 0.0])
    np.testing.assert_array_equal(held, np.zeros(D))
    assert limiter.rejections == {
        "non-finite value": 1,
        "elbow_pitch target out of range [-0.2, 2.4]": 1,
        "shape (2,), expected (4,)": 1,
    }
    assert "non-finite value" in caplog.text and "elbow_pitch target out of range" in caplog.text


def test_slightly_out_of_range_target_is_clamped_not_rejected():
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(position_tolerance=0.05))
    limiter.reset(SPEC.upper() - 0.001)
    limiter.filter(SPEC.upper() + 0.01)
    assert limiter.rejections == {}


def test_brake_brings_a_moving_arm_to_a_hold_at_full_deceleration():
    limiter = SafetyLimiter(SPEC, DT)
    limiter.reset(np.zeros(D))
    for _ in range(20):  # accelerate towards the upper limits (still far from them)
        limiter.filter(SPEC.upper())
    assert np.all(np.abs(limiter.state.velocity) > 0.5)
    ticks = int(np.max(np.abs(limiter.state.velocity) / (SPEC.max_acceleration() * DT))) + 2
    for _ in range(ticks):
        limiter.filter(None)
    np.testing.assert_allclose(limiter.state.velocity, 0.0, atol=1e-9)


def test_watchdog_fires_after_its_deadline_and_rearms_on_a_fresh_chunk(caplog):
    dog = Watchdog(timeout_s=0.5)
    dog.start(0.0)
    assert not dog.expired(0.5)
    with caplog.at_level(logging.WARNING, logger="worldloop.real_robot.watchdog"):
        assert dog.expired(0.51) and dog.expired(0.9)
    assert dog.fired_count == 1 and "braking to a hold" in caplog.text
    dog.feed(1.0)
    assert not dog.expired(1.2)


def test_bad_limit_scale_is_a_clear_error():
    with pytest.raises(ValueError, match=r"safety.limit_scale must be in \(0, 1\]"):
        SafetyLimiter(SPEC, DT, SafetyConfig(limit_scale=2.0))
