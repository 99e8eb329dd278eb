"""Safety layer and watchdog: limits hold for any target stream from any start (outside the limits too),
bad actions are rejected with a reason, the tracking guard trips, bad config values are named errors."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worldloop.common.config import ConfigError, parse_cli
from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.deploy import DeployConfig
from worldloop.real_robot.recorder import RecordConfig
from worldloop.real_robot.runtime import RuntimeConfig
from worldloop.real_robot.safety import (
    SafetyConfig,
    SafetyLimiter,
    SafetyStop,
    TrackingGuard,
    limit_violations,
)
from worldloop.real_robot.watchdog import Watchdog

SPEC = TABLETOP_ARM
DT = 0.01
D = SPEC.num_joints

targets = st.one_of(
    st.lists(st.floats(-5.0, 5.0), min_size=D, max_size=D),  # in and far out of range, big jumps
    st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=D, max_size=D),
    st.none(),  # brake to a hold
)


@settings(max_examples=60, deadline=None)
@given(st.lists(targets, min_size=1, max_size=200), st.floats(0.0, 1.0), st.sampled_from([1.0, 0.5]))
def test_limits_are_never_exceeded_whatever_the_targets(stream, where, scale):
    start = SPEC.lower() + where * (SPEC.upper() - SPEC.lower())
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(limit_scale=scale))
    limiter.reset(start)
    commands = np.array([limiter.filter(t) for t in stream])
    assert limit_violations(SPEC, DT, start, commands, scale) == []


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


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-0.25, 1.25), min_size=D, max_size=D),  # up to a quarter of the range outside
    st.lists(targets, min_size=0, max_size=100),
    st.sampled_from([1.0, 0.5]),
)
def test_limits_hold_from_any_start_including_outside_the_limits(where, stream, scale):
    lower, upper = SPEC.lower(), SPEC.upper()
    start = lower + np.array(where) * (upper - lower)
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(limit_scale=scale, start_margin=10.0))
    heading = limiter.reset(start)
    np.testing.assert_array_equal(heading, np.clip(start, lower, upper))
    # the stream, then holds until every joint is back inside its limits and at rest
    vmax, amax = scale * SPEC.max_velocity(), scale * SPEC.max_acceleration()
    settle = int(np.max(np.abs(start - heading) / vmax + 2 * vmax / amax) / DT) + 20
    commands = np.array([limiter.filter(t) for t in [*stream, *[None] * settle]])
    assert limit_violations(SPEC, DT, start, commands, scale) == []  # from rest: no first-tick jump
    outside = np.maximum(np.maximum(lower - commands, commands - upper), 0.0)
    assert np.all(outside[-1] == 0.0) and limiter.at_rest()  # brought inside by the holds


def test_a_joint_outside_its_limit_moves_in_at_the_acceleration_limit_not_in_one_step():
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(start_margin=0.5))
    start = np.array([2.1, 0.0, 0.0, 0.0])  # base_yaw 0.3 rad beyond its 1.8 rad limit
    limiter.reset(start)
    first = limiter.filter([1.0, 0.0, 0.0, 0.0])
    assert 2.1 - first[0] == pytest.approx(SPEC.max_acceleration()[0] * DT * DT)  # 1.2 mm, not 0.3 rad


def test_a_start_further_out_than_the_margin_is_refused():
    limiter = SafetyLimiter(SPEC, DT, SafetyConfig(start_margin=0.2))
    with pytest.raises(SafetyStop, match=r"base_yaw is at 2.1, 0.3 outside its limits \[-1.8, 1.8\], more "):
        limiter.reset(np.array([2.1, 0.0, 0.0, 0.0]))
    assert not limiter.started


def test_a_non_finite_limiter_output_is_raised_not_returned():
    limiter = SafetyLimiter(SPEC, DT)
    limiter.reset(np.zeros(D))
    limiter.amax = np.full(D, np.inf)  # what a zero control period did: NaN from the second tick
    with pytest.raises(FloatingPointError, match="non-finite command"), np.errstate(invalid="ignore"):
        limiter.filter(np.full(D, 0.1))
    np.testing.assert_array_equal(limiter.state.position, np.zeros(D))  # the state is not poisoned


def test_tracking_guard_trips_after_its_ticks_and_rearms_when_the_arm_follows():
    guard = TrackingGuard(SPEC, SafetyConfig(tracking_margin=0.1, tracking_ticks=20))
    command, far = np.zeros(D), np.array([0.0, 0.5, 0.0, 0.0])
    assert guard.update(0, far, command) is None and guard.update(20, far, command) is None
    assert guard.update(25, command, command) is None  # followed again: the count restarts
    assert guard.update(30, far, command) is None and guard.update(50, far, command) is None
    reason = guard.update(51, far, command)
    assert reason is not None and "shoulder_pitch measured at 0.5 but commanded 0" in reason
    excluded = TrackingGuard(
        SPEC, SafetyConfig(tracking_margin=0.1, tracking_ticks=1, tracking_exclude=["shoulder_pitch"])
    )
    assert excluded.update(0, far, command) is None and excluded.update(10, far, command) is None
    with pytest.raises(ValueError, match=r"safety.tracking_exclude: \['grip'\] are not joints"):
        TrackingGuard(SPEC, SafetyConfig(tracking_exclude=["grip"]))


BAD_VALUES = [
    (RuntimeConfig, "control_hz", float("inf"), "runtime.control_hz must be finite"),
    (RuntimeConfig, "control_hz", 0.0, r"runtime.control_hz must be in \(0, 10000\]"),
    (RuntimeConfig, "watchdog_timeout_s", float("inf"), "runtime.watchdog_timeout_s must be finite"),
    (RuntimeConfig, "watchdog_timeout_s", -1.0, r"runtime.watchdog_timeout_s must be in \(0, inf\)"),
    (RuntimeConfig, "request_threshold", 1.5, r"runtime.request_threshold must be in \(0, 1\]"),
    (RuntimeConfig, "delay_margin", float("nan"), "runtime.delay_margin must be finite"),
    (RuntimeConfig, "sync_action_steps", 0, r"runtime.sync_action_steps must be in \[1, inf\)"),
    (RuntimeConfig, "spin_s", 0.5, r"runtime.spin_s must be in \[0, 0.01\]"),
    (RuntimeConfig, "realtime_priority", 100, r"runtime.realtime_priority must be in \[0, 99\]"),
    (RuntimeConfig, "status_every_s", -0.5, "runtime.status_every_s must be in"),
    (RuntimeConfig, "stop_hold_s", float("inf"), "runtime.stop_hold_s must be finite"),
    (RuntimeConfig, "rest_speed_scale", 0.0, r"runtime.rest_speed_scale must be in \(0, 1\]"),
    (RuntimeConfig, "rest_pose", [0.0, float("nan")], r"runtime.rest_pose\[1\] must be finite"),
    (SafetyConfig, "position_tolerance", -5.0, r"safety.position_tolerance must be in \[0, inf\)"),
    (SafetyConfig, "position_tolerance", float("nan"), "safety.position_tolerance must be finite"),
    (SafetyConfig, "limit_scale", 2.0, r"safety.limit_scale must be in \(0, 1\]"),
    (SafetyConfig, "start_margin", -0.1, "safety.start_margin must be in"),
    (SafetyConfig, "tracking_margin", 0.0, r"safety.tracking_margin must be in \(0, inf\)"),
    (SafetyConfig, "tracking_ticks", 2.5, "safety.tracking_ticks must be a whole number"),
    (RecordConfig, "segment_s", float("inf"), "record.segment_s must be finite"),
    (DeployConfig, "episode_time_s", -1.0, r"episode_time_s must be in \(0, inf\)"),
    (DeployConfig, "inference_threads", 0, r"inference_threads must be in \[1, inf\)"),
    (DeployConfig, "inference", "gpu", "inference must be 'thread' or 'process'"),
]


@pytest.mark.parametrize(
    "config, name, value, message", BAD_VALUES, ids=[f"{c.__name__}.{n}={v}" for c, n, v, _ in BAD_VALUES]
)
def test_every_bad_runtime_value_is_a_named_error(config, name, value, message):
    with pytest.raises(ValueError, match=message):
        config(**{name: value})


def test_a_bad_value_on_the_command_line_names_the_field():
    with pytest.raises(ConfigError, match="runtime.control_hz must be finite"):
        parse_cli(DeployConfig, ["--runtime.control_hz=inf"])


def test_limit_violations_names_what_a_stream_breaks():
    start = np.zeros(D)
    assert limit_violations(SPEC, DT, start, [np.full(D, 0.5)]) == [
        "velocity: 25.000x the limit",
        "acceleration: 416.667x the limit",
    ]
    outside = np.array([2.0, 0.0, 0.0, 0.0])
    assert limit_violations(SPEC, DT, outside, [outside + [0.0001, 0, 0, 0]])[0].startswith("position:")
