"""Property tests of the chunk fusers: continuity at switches, delay alignment, and the baselines' rules."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.fusion import Chunk, FuserConfig, KinematicState, make_fuser
from worldloop.real_robot.fusion.rail import RailFuser, quintic_correction

SPEC = TABLETOP_ARM
CONTROL_DT = 0.01
POLICY_DT = 1.0 / SPEC.fps
D = SPEC.num_joints
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def chunk_streams(draw):
    """A start pose and a sequence of (chunk, obs_time, arrival_time): random walks, random delays."""
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    horizon = draw(st.integers(4, 16))
    n_chunks = draw(st.integers(1, 6))
    mid = 0.5 * (SPEC.lower() + SPEC.upper())
    span = 0.25 * (SPEC.upper() - SPEC.lower())
    start = mid + rng.uniform(-span, span)
    stream, obs_time = [], 0.0
    for _ in range(n_chunks):
        steps = rng.normal(0, 0.05, (horizon, D)).cumsum(0) + rng.normal(0, 0.02, (horizon, D))
        actions = np.clip(start + rng.uniform(-span, span) * 0.3 + steps, SPEC.lower(), SPEC.upper())
        delay = CONTROL_DT * draw(st.integers(0, 40))  # 0 to 400 ms
        stream.append((actions, obs_time, obs_time + delay))
        obs_time += CONTROL_DT * draw(st.integers(1, horizon * 10))
    stream.sort(key=lambda s: s[2])
    return start, stream


def _assert_state_equal(a: KinematicState, b: KinematicState, what: str, atol: float = 1e-9):
    """Equal position, velocity, acceleration; `atol` scales up for derivatives (and one-sided limits)."""
    np.testing.assert_allclose(a.position, b.position, atol=atol, err_msg=f"position jumps at {what}")
    np.testing.assert_allclose(a.velocity, b.velocity, atol=100 * atol, err_msg=f"velocity jumps at {what}")
    np.testing.assert_allclose(
        a.acceleration, b.acceleration, atol=1e4 * atol, err_msg=f"acceleration jumps at {what}"
    )


@SETTINGS
@given(chunk_streams())
def test_rail_is_c2_continuous_at_every_switch_and_blend_end(stream):
    start, chunks = stream
    fuser = RailFuser(SPEC, CONTROL_DT)
    fuser.reset(start)
    for actions, obs_time, arrival in chunks:
        before = fuser.state(arrival)
        executed = fuser.state(arrival - CONTROL_DT)  # the runtime passes the last command sent
        fuser.add_chunk(Chunk(actions, obs_time, POLICY_DT), arrival, executed)
        _assert_state_equal(before, fuser.state(arrival), f"the switch at t={arrival:.2f}s")
        end = arrival + fuser._blend
        eps = 1e-10  # one-sided limits: the state may only change by (derivative x 2 eps)
        # A blend that ends where the chunk's plan ends meets the hold that follows a plan (a stall: the arm
        # stops there whatever the blend does), so only blends that end inside the plan are compared.
        if end < fuser.plan_end() - 2 * eps:
            _assert_state_equal(fuser.state(end - eps), fuser.state(end + eps), "the end of the blend", 1e-8)


@SETTINGS
@given(
    st.lists(st.floats(-3.0, 3.0), min_size=D, max_size=D),
    st.lists(st.floats(-5.0, 5.0), min_size=D, max_size=D),
    st.lists(st.floats(-50.0, 50.0), min_size=D, max_size=D),
    st.floats(0.05, 2.0),
)
def test_quintic_correction_meets_its_boundary_conditions(dp, dv, da, duration):
    dp, dv, da = map(np.asarray, (dp, dv, da))
    c = quintic_correction(dp, dv, da, duration)
    at = lambda tau, order: np.polynomial.polynomial.polyval(  # noqa: E731
        tau, np.polynomial.polynomial.polyder(c, order) if order else c
    )
    np.testing.assert_allclose(at(0.0, 0), dp, atol=1e-9)
    np.testing.assert_allclose(at(0.0, 1), dv, atol=1e-9)
    np.testing.assert_allclose(at(0.0, 2), da, atol=1e-9)
    for order in range(3):
        np.testing.assert_allclose(at(duration, order), 0.0, atol=1e-6 * (1 + duration**-order) * 100)


@SETTINGS
@given(st.sampled_from(["naive", "rtc", "temporal_ensemble", "weighted_average"]), st.integers(0, 35))
def test_a_late_chunk_is_sampled_at_the_current_tick(name, delay_ticks):
    """A chunk that arrives `delay` after its observation starts from the action due now, not its first."""
    fuser = make_fuser(FuserConfig(name=name), SPEC, CONTROL_DT)
    fuser.reset(np.zeros(D))
    ramp = 0.1 * np.arange(1, 11)[:, None] * np.ones(D)  # action k = 0.1 (k + 1): position = time
    arrival = delay_ticks * CONTROL_DT
    fuser.add_chunk(Chunk(ramp, 0.0, POLICY_DT), arrival, KinematicState.at_rest(np.zeros(D)))
    expected = np.full(D, max(arrival, POLICY_DT))  # before the first action's time it is held
    np.testing.assert_allclose(fuser.command(arrival), expected, atol=1e-9)


@SETTINGS
@given(st.integers(0, 35), st.floats(-0.5, 0.5), st.floats(-0.5, 0.5))
def test_rail_converges_onto_the_delay_aligned_chunk(delay_ticks, offset, slope):
    """After the blend, rail follows the chunk at its own time stamps (a cubic chunk is fitted exactly)."""
    fuser = RailFuser(SPEC, CONTROL_DT, smoother_degree=3)
    fuser.reset(np.zeros(D))
    t = POLICY_DT * np.arange(1, 17)
    curve = lambda t: offset + slope * t + 0.1 * t**2 - 0.05 * t**3  # noqa: E731
    actions = curve(t)[:, None] * np.ones(D)
    arrival = delay_ticks * CONTROL_DT
    fuser.add_chunk(Chunk(actions, 0.0, POLICY_DT), arrival, fuser.state(arrival - CONTROL_DT))
    for s in np.arange(arrival + fuser._blend + 1e-6, t[-1], 0.05):
        np.testing.assert_allclose(fuser.command(s), curve(s), atol=1e-9)


def test_temporal_ensemble_uses_acts_exponential_weights():
    fuser = make_fuser(FuserConfig(name="temporal_ensemble", ensemble_coeff=0.5), SPEC, CONTROL_DT)
    fuser.reset(np.zeros(D))
    rest = KinematicState.at_rest(np.zeros(D))
    fuser.add_chunk(Chunk(np.full((10, D), 1.0), 0.0, POLICY_DT), 0.1, rest)
    fuser.add_chunk(Chunk(np.full((10, D), 2.0), 0.3, POLICY_DT), 0.4, rest)
    w_new = np.exp(-0.5)  # the older chunk has weight 1
    np.testing.assert_allclose(fuser.command(0.5), (1.0 + 2.0 * w_new) / (1 + w_new))
    np.testing.assert_allclose(fuser.command(1.2), 2.0)  # the first chunk ended at t=1.0


def test_weighted_average_blends_overlap_03_old_07_new():
    fuser = make_fuser(FuserConfig(name="weighted_average"), SPEC, CONTROL_DT)
    fuser.reset(np.zeros(D))
    rest = KinematicState.at_rest(np.zeros(D))
    fuser.add_chunk(Chunk(np.full((10, D), 1.0), 0.0, POLICY_DT), 0.1, rest)
    fuser.add_chunk(Chunk(np.full((10, D), 2.0), 0.5, POLICY_DT), 0.6, rest)
    np.testing.assert_allclose(fuser.command(0.8), 0.3 * 1.0 + 0.7 * 2.0)  # both cover t=0.8
    np.testing.assert_allclose(fuser.command(1.4), 2.0)  # only the new chunk reaches t=1.4


def test_naive_drops_a_chunk_older_than_the_executing_one():
    fuser = make_fuser(FuserConfig(name="naive"), SPEC, CONTROL_DT)
    fuser.reset(np.zeros(D))
    rest = KinematicState.at_rest(np.zeros(D))
    fuser.add_chunk(Chunk(np.full((10, D), 1.0), 0.5, POLICY_DT), 0.6, rest)
    fuser.add_chunk(Chunk(np.full((10, D), 2.0), 0.2, POLICY_DT), 0.7, rest)
    np.testing.assert_allclose(fuser.command(0.8), 1.0)


def _jerk_rms(commands: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.diff(commands, n=3, axis=0) ** 2)) / CONTROL_DT**3)


def test_rail_is_smoother_than_naive_on_noisy_chunks():
    results = {}
    for name in ("naive", "rail"):
        fuser = make_fuser(FuserConfig(name=name), SPEC, CONTROL_DT)
        fuser.reset(np.zeros(D))
        commands = []
        for tick in range(400):
            now = tick * CONTROL_DT
            if tick % 50 == 20:  # a chunk every 0.5 s, 200 ms after its observation
                obs = now - 0.2
                t = obs + POLICY_DT * np.arange(1, 11)
                actions = 0.3 * np.sin(t)[:, None] + np.random.default_rng(tick).normal(0, 0.01, (10, D))
                executed = KinematicState.at_rest(commands[-1] if commands else np.zeros(D))
                fuser.add_chunk(Chunk(actions, obs, POLICY_DT), now, executed)
            commands.append(fuser.command(now))
        results[name] = _jerk_rms(np.array(commands[30:]))
    assert results["rail"] * 5 < results["naive"], results


def test_unknown_fuser_name_is_a_clear_error():
    with pytest.raises(ValueError, match="fuser.name: unknown fuser 'bogus'"):
        make_fuser(FuserConfig(name="bogus"), SPEC, CONTROL_DT)


def test_rail_continues_from_the_executed_command_when_safety_overrode_the_plan():
    """After a watchdog brake the arm stands still elsewhere than the plan: the blend starts from there."""
    fuser = RailFuser(SPEC, CONTROL_DT)
    fuser.reset(np.zeros(D))
    ramp = 0.1 * np.arange(1, 11)[:, None] * np.ones(D)
    fuser.add_chunk(Chunk(ramp, 0.0, POLICY_DT), 0.0, KinematicState.at_rest(np.zeros(D)))
    held = KinematicState.at_rest(np.full(D, 0.05))  # braked to a hold at 0.05 while the plan went on
    fuser.add_chunk(Chunk(ramp + 0.4, 0.4, POLICY_DT), 0.5, held)
    start = fuser.state(0.5)
    np.testing.assert_allclose(start.position, 0.05, atol=1e-12)
    np.testing.assert_allclose(start.velocity, 0.0, atol=1e-12)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["naive", "temporal_ensemble", "weighted_average", "rail", "rtc"]), chunk_streams())
def test_fused_commands_after_safety_never_exceed_the_limits(name, stream):
    from worldloop.real_robot.safety import SafetyLimiter

    start, chunks = stream
    fuser = make_fuser(FuserConfig(name=name), SPEC, CONTROL_DT)
    safety = SafetyLimiter(SPEC, CONTROL_DT)
    fuser.reset(safety.reset(start))
    pending = list(chunks)
    commands = [safety.state.position]
    for tick in range(int((chunks[-1][2] + 1.0) / CONTROL_DT)):
        now = tick * CONTROL_DT
        while pending and pending[0][2] <= now + 1e-9:
            actions, obs_time, _ = pending.pop(0)
            fuser.add_chunk(Chunk(actions * 3.0, obs_time, POLICY_DT), now, safety.state)  # some out of range
        commands.append(safety.filter(fuser.command(now)))
    path = np.array(commands)
    assert np.all(path >= SPEC.lower() - 1e-12) and np.all(path <= SPEC.upper() + 1e-12)
    v = np.diff(path, axis=0) / CONTROL_DT
    assert np.all(np.abs(v) <= SPEC.max_velocity() * (1 + 1e-9))
    assert np.all(np.abs(np.diff(v, axis=0)) / CONTROL_DT <= SPEC.max_acceleration() * (1 + 1e-6) + 1e-6)
