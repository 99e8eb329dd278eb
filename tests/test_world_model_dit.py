"""Video DiT and rollouts: shapes, frame causality, train/rollout consistency, KV cache == recompute."""

from __future__ import annotations

import pytest
import torch

from worldloop.world_model import flow
from worldloop.world_model.configuration_world_model import WorldModelConfig
from worldloop.world_model.dit import VideoDiT, VideoDiTConfig, warp
from worldloop.world_model.model import WorldModel

SIZE = 16


def dit_config(**kw) -> VideoDiTConfig:
    base = dict(
        image_size=SIZE, patch_size=4, width=32, depth=2, heads=2, context_frames=2, output_conv_channels=8
    )
    return VideoDiTConfig(**{**base, **kw})


def randomise(module: torch.nn.Module) -> torch.nn.Module:
    """Zero-initialised output/AdaLN layers make outputs ignore inputs: give every weight random values."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.1)
    return module.eval()


def dit_inputs(b: int, f: int, views: int = 1, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, f, views, 3, SIZE, SIZE, generator=g)
    prev = torch.randn(b, f, views, 3, SIZE, SIZE, generator=g)
    return (
        x,
        prev,
        torch.randn(b, f, 4, generator=g),
        torch.ones(b, f, dtype=torch.bool),
        torch.rand(b, f, generator=g),
    )


@pytest.mark.parametrize("views", [1, 2])
def test_dit_shapes(views):
    dit = randomise(VideoDiT(dit_config(num_views=views)))
    x, prev, a, valid, t = dit_inputs(2, 3, views)
    out, kv = dit(x, prev, a, valid, t, torch.arange(3))
    assert out.shape == x.shape
    assert len(kv) == 2 and kv[0][0].shape == (2, 2, 3 * views * 16, 16)


@pytest.mark.parametrize("conditioned", [False, True])
@pytest.mark.parametrize("teacher_forced", [False, True])
def test_output_of_the_last_frames_alone_equals_the_full_pass(teacher_forced, conditioned):
    """output_frames=n draws what a full pass draws for the last n frames (with a per-frame base of all F
    frames or of those n), the same keys/values and tokens; 0 draws nothing; a count beyond F is an error."""
    dit = randomise(
        VideoDiT(
            dit_config(
                warp_previous_frame=True, residual_to_previous_frame=True, output_conv_conditioned=conditioned
            )
        )
    )
    x, prev, a, valid, t = dit_inputs(2, 5)
    base = torch.randn_like(x)
    args = (x, prev, a, valid, t, torch.arange(5))
    full, kv, tokens = dit(*args, teacher_forced=teacher_forced, return_internals=True, base=base)
    for n, given in ((2, base), (2, base[:, -2:]), (5, base)):
        out, kv_n, tokens_n = dit(
            *args, teacher_forced=teacher_forced, return_internals=True, base=given, output_frames=n
        )
        torch.testing.assert_close(out, full[:, -n:], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tokens_n, tokens)
        torch.testing.assert_close(kv_n[0][0], kv[0][0])
    none, kv_0 = dit(*args, teacher_forced=teacher_forced, output_frames=0)
    assert none is None and torch.equal(kv_0[1][1], kv[1][1])
    with pytest.raises(ValueError, match="output_frames=6"):
        dit(*args, output_frames=6)


@pytest.mark.parametrize("views", [1, 2])
def test_conditioned_output_conv_moves_pixels_by_the_action_alone(views):
    """With the transformer's output zeroed, only the output convolution can tell two actions apart: the
    plain one cannot (it never sees the action), the conditioned one does, where it sees each pixel's place."""
    x, prev, a, valid, t = dit_inputs(2, 3, views)
    outputs = {}
    for conditioned in (False, True):
        dit = randomise(VideoDiT(dit_config(num_views=views, output_conv_conditioned=conditioned)))
        with torch.no_grad():
            dit.final.weight.zero_()
            dit.final.bias.zero_()
        out, _ = dit(x, prev, a, valid, t, torch.arange(3))
        moved, _ = dit(x, prev, a + 1.0, valid, t, torch.arange(3))
        outputs[conditioned] = (out - moved).abs().max()
    assert outputs[False] == 0 and outputs[True] > 1e-3
    # zero-initialised modulation: a new conditioned convolution starts as the plain one (same weights)
    plain, conditioned = VideoDiT(dit_config()), VideoDiT(dit_config(output_conv_conditioned=True))
    assert conditioned.refine[0].in_channels == plain.refine[0].in_channels + 2
    assert not conditioned.refine_film.weight.any() and not conditioned.refine_film.bias.any()


def test_dit_rejects_wrong_frame_shape():
    dit = VideoDiT(dit_config())
    x, prev, a, valid, t = dit_inputs(1, 2)
    with pytest.raises(ValueError, match=r"expects frames \[B, F, 1, 3, 16, 16\]"):
        dit(x[..., :8, :8], prev[..., :8, :8], a, valid, t, torch.arange(2))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="dit.image_size=18"):
        VideoDiT(dit_config(image_size=18))
    with pytest.raises(ValueError, match="dit.attention_backend"):
        VideoDiT(dit_config(attention_backend="flash9"))
    with pytest.raises(ValueError, match="num_views"):
        WorldModel(WorldModelConfig(dit=dit_config(), cameras=("front", "wrist")))
    with pytest.raises(ValueError, match="parameterisation"):
        WorldModel(WorldModelConfig(dit=dit_config(residual_to_previous_frame=False), parameterisation="eps"))
    with pytest.raises(ValueError, match="noise_floor"):
        WorldModel(WorldModelConfig(dit=dit_config(), noise_floor=1.0))
    with pytest.raises(ValueError, match="residual_to_previous_frame"):
        WorldModel(WorldModelConfig(dit=dit_config(), parameterisation="velocity"))
    with pytest.raises(ValueError, match="dit.warp_previous_frame"):
        VideoDiT(dit_config(warp_previous_frame=True, residual_to_previous_frame=False))


@pytest.mark.parametrize("teacher_forced", [False, True])
def test_future_frames_and_actions_never_change_the_past(teacher_forced):
    dit = randomise(VideoDiT(dit_config()))
    f = 7 if teacher_forced else 4  # teacher-forced: 4 clean frames + 3 noisy
    x, prev, a, valid, t = dit_inputs(1, f)
    index = torch.cat([torch.arange(4), torch.arange(1, 4)]) if teacher_forced else torch.arange(f)
    out, _ = dit(x, prev, a, valid, t, index, teacher_forced=teacher_forced)
    # change the last time step everywhere it occurs (clean frame 3 and, teacher-forced, noisy frame 3)
    changed = [3, 6] if teacher_forced else [3]
    x2, a2 = x.clone(), a.clone()
    x2[:, changed] += 1.0
    a2[:, changed] += 1.0
    out2, _ = dit(x2, prev, a2, valid, t, index, teacher_forced=teacher_forced)
    past = [0, 1, 2, 4, 5] if teacher_forced else [0, 1, 2]
    torch.testing.assert_close(out[:, past], out2[:, past], rtol=0, atol=1e-5)
    assert (
        out[:, changed] - out2[:, changed]
    ).abs().max() > 1e-3  # and the change is seen where it should be


def test_context_window_limits_what_a_frame_sees():
    dit = randomise(VideoDiT(dit_config(context_frames=2)))
    x, prev, a, valid, t = dit_inputs(1, 5)
    out, _ = dit(x, prev, a, valid, t, torch.arange(5))
    x2 = x.clone()
    x2[:, 0] += 1.0
    out2, _ = dit(x2, prev, a, valid, t, torch.arange(5))
    # frame 2 sees frame 0 directly; with 2 layers frame 4 sees it through frame 2; frames are otherwise local
    assert (out[:, 2] - out2[:, 2]).abs().max() > 1e-3
    assert (out[:, 4] - out2[:, 4]).abs().max() > 1e-6  # indirect, so weaker
    one_layer = randomise(VideoDiT(dit_config(context_frames=2, depth=1)))
    o1, _ = one_layer(x, prev, a, valid, t, torch.arange(5))
    o2, _ = one_layer(x2, prev, a, valid, t, torch.arange(5))
    torch.testing.assert_close(o1[:, 3:], o2[:, 3:], rtol=0, atol=1e-6)


def test_teacher_forced_training_sees_what_a_rollout_sees():
    """Noisy frame i in the training layout == the same frame denoised after clean frames 0..i-1."""
    dit = randomise(VideoDiT(dit_config(context_frames=2)))
    clean, prev, a, valid, t_ctx = dit_inputs(1, 4, seed=2)
    noisy, _, _, _, t = dit_inputs(1, 3, seed=3)
    seq_prev = torch.cat([prev, clean[:, :-1]], 1)
    out, _ = dit(
        torch.cat([clean, noisy], 1),
        seq_prev,
        torch.cat([a, a[:, 1:]], 1),
        torch.ones(1, 7, dtype=torch.bool),
        torch.cat([t_ctx, t], 1),
        torch.cat([torch.arange(4), torch.arange(1, 4)]),
        teacher_forced=True,
    )
    for i in (1, 2, 3):  # noisy frame i is position 4 + i - 1
        seq = torch.cat([clean[:, :i], noisy[:, i - 1 : i]], 1)
        p = torch.cat([prev[:, :i], clean[:, i - 1 : i]], 1)
        ref, _ = dit(
            seq,
            p,
            torch.cat([a[:, :i], a[:, i : i + 1]], 1),
            torch.ones(1, i + 1, dtype=torch.bool),
            torch.cat([t_ctx[:, :i], t[:, i - 1 : i]], 1),
            torch.arange(i + 1),
        )
        torch.testing.assert_close(out[:, 3 + i], ref[:, -1], rtol=1e-4, atol=1e-4)


def tiny_model(**kw) -> WorldModel:
    return randomise(WorldModel(WorldModelConfig(dit=dit_config(**kw))))


def rollout_inputs(b=2, c=3, h=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.rand(b, c, 3, SIZE, SIZE, generator=g),
        torch.randn(b, c - 1, 4, generator=g),
        torch.randn(b, h, 4, generator=g),
    )


def test_rollout_shapes_and_ranges():
    model = tiny_model()
    frames, rewards, success = model.rollout(*rollout_inputs(), steps=2, future_state=torch.randn(2, 5, 4))
    assert frames.shape == (2, 5, 3, SIZE, SIZE)
    assert rewards.shape == success.shape == (2, 5)
    assert frames.min() >= 0 and frames.max() <= 1
    assert ((success >= 0) & (success <= 1)).all()
    # The heads read the joint state: without it a rollout draws frames only.
    frames_only, rewards, success = model.rollout(*rollout_inputs(), steps=2)
    assert rewards is None and success is None and frames_only.shape == frames.shape


@pytest.mark.parametrize(
    "method, action_delta, conditioned, previous",
    [
        ("euler", False, False, 1),
        ("heun", False, False, 1),
        ("euler", True, False, 1),
        ("euler", False, True, 1),
        ("euler", False, True, 2),
        ("euler", False, False, "warp"),
        ("euler", False, False, "bicubic"),
    ],
)
def test_kv_cache_rollout_equals_recompute(method, action_delta, conditioned, previous):
    model = tiny_model(
        action_delta=action_delta,
        output_conv_conditioned=conditioned,
        previous_frames=previous if isinstance(previous, int) else 1,
        warp_previous_frame=not isinstance(previous, int),
        warp_read="bicubic" if previous == "bicubic" else "bilinear",
    )
    model.cfg.sampler.method = method
    inputs = rollout_inputs(h=6)
    state = torch.randn(2, 6, 4)
    cached = model.rollout(*inputs, steps=3, generator=torch.Generator().manual_seed(5), future_state=state)
    recomputed = model.rollout(
        *inputs, steps=3, generator=torch.Generator().manual_seed(5), use_cache=False, future_state=state
    )
    for c, r in zip(cached, recomputed):
        torch.testing.assert_close(c, r, rtol=1e-4, atol=1e-4)


def test_rollout_is_deterministic_under_a_generator_and_depends_on_actions():
    model = tiny_model()
    ctx, ctx_a, fut = rollout_inputs()
    a = model.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(1))[0]
    b = model.rollout(ctx, ctx_a, fut, generator=torch.Generator().manual_seed(1))[0]
    c = model.rollout(ctx, ctx_a, fut + 1.0, generator=torch.Generator().manual_seed(1))[0]
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 1e-3


def test_action_delta_features_step_by_step_equal_the_whole_sequence():
    """A rollout builds each frame's action input one step at a time; training builds them for a window."""
    model = tiny_model(action_delta=True)
    a = torch.randn(2, 6, 4)
    whole = model.action_features(a)
    assert whole.shape == (2, 6, 8)
    torch.testing.assert_close(whole[:, 0, 4:], torch.zeros(2, 4))  # no earlier action: no change
    for k in range(1, 6):
        torch.testing.assert_close(model.action_features(a[:, k : k + 1], a[:, k - 1 : k])[:, 0], whole[:, k])
    lead = model.lead_action_features(a)
    torch.testing.assert_close(lead[:, 1:], whole[:, :-1])
    assert torch.equal(tiny_model().action_features(a), a)  # off: the actions as they are


def test_guidance_runs_and_changes_the_result():
    model = tiny_model()
    inputs = rollout_inputs(h=2)
    plain = model.rollout(*inputs, generator=torch.Generator().manual_seed(1))[0]
    model.cfg.sampler.guidance_scale = 2.0
    with pytest.raises(ValueError, match="needs a model trained with model.action_dropout"):
        model.rollout(*inputs)
    model.cfg.action_dropout = 0.1
    guided = model.rollout(*inputs, generator=torch.Generator().manual_seed(1))[0]
    assert (plain - guided).abs().max() > 1e-4


def test_rollout_input_errors():
    model = tiny_model()
    ctx, ctx_a, fut = rollout_inputs()
    with pytest.raises(ValueError, match="context_actions: expected"):
        model.rollout(ctx, ctx_a[:, :1], fut)
    with pytest.raises(ValueError, match="future_actions: expected"):
        model.rollout(ctx, ctx_a, fut[..., :3])
    with pytest.raises(ValueError, match="context_frames: expected"):
        model.rollout(ctx[..., :8, :8], ctx_a, fut)


@pytest.mark.parametrize("parameterisation", ["x0", "velocity", "edm"])
def test_training_loss_matches_parameterisation_and_is_finite(parameterisation):
    dit = dit_config(residual_to_previous_frame=False)
    model = WorldModel(WorldModelConfig(dit=dit, parameterisation=parameterisation))
    frames = torch.rand(2, 4, 3, SIZE, SIZE)
    loss, logs = model.compute_loss(frames, torch.randn(2, 4, 4))
    assert torch.isfinite(loss)
    assert {"loss/diffusion", "loss/idm", "loss/x0_mse"} <= set(logs)
    # zero-initialised output and no residual: an x0 model predicts 0, its loss is the mean square of x0
    if parameterisation == "x0":
        x = frames[:, 1:] * 2 - 1
        assert logs["loss/diffusion"] == pytest.approx(float(x.pow(2).mean()), rel=1e-4)


def test_flow_paths_agree():
    x0, noise = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    t = torch.rand(3, 2) * 0.9 + 0.05
    x_t = flow.add_noise(x0, noise, t)
    for par in flow.PARAMETERISATIONS:
        target = flow.training_target(x0, noise, x_t, t, par, 0.5)
        torch.testing.assert_close(flow.to_x0(target, x_t, t, par, 0.5), x0, rtol=1e-4, atol=1e-4)


def test_residual_output_starts_as_a_copy_of_the_previous_frame():
    dit = VideoDiT(dit_config())  # zero-initialised output layers: the learned change starts at 0
    x, prev, a, valid, t = dit_inputs(1, 2)
    out, _ = dit(x, prev, a, valid, t, torch.arange(2))
    torch.testing.assert_close(out, prev)


def square(x0: int, y0: int) -> torch.Tensor:
    """[1, 3, 12, 12] a 4-pixel bright square with its corner at (x0, y0) on a dark table."""
    frame = torch.zeros(1, 3, 12, 12)
    frame[..., y0 : y0 + 4, x0 : x0 + 4] = 1.0
    return frame


def test_warp_reads_the_frame_at_the_displaced_position():
    frame = square(4, 4)
    still = torch.zeros(1, 2, 12, 12)
    torch.testing.assert_close(warp(frame, still), frame)
    # Reading one pixel to the left everywhere draws the square one pixel to the right.
    left = still.clone()
    left[:, 0] = -1.0
    torch.testing.assert_close(warp(frame, left), square(5, 4))
    up = still.clone()
    up[:, 1] = 1.0  # reading one pixel below draws the square one pixel up
    torch.testing.assert_close(warp(frame, up), square(4, 3))
    half = warp(frame, left * 0.5)  # half a pixel: the edges blend bilinearly
    assert half[0, 0, 5, 4] == pytest.approx(0.5) and half[0, 0, 5, 8] == pytest.approx(0.5)
    assert half[0, 0, 5, 5] == pytest.approx(1.0) and half[0, 0, 5, 3] == pytest.approx(0.0)


def test_bicubic_warp_moves_by_fractions_with_less_blur_and_the_same_flow_gradient():
    frame = square(4, 4)
    left = torch.zeros(1, 2, 12, 12)
    left[:, 0] = -1.0
    torch.testing.assert_close(warp(frame, left, mode="bicubic"), square(5, 4))  # whole pixels: a copy
    # a rollout reads its own output again every frame: ten reads 0.3 px to the left move the square 3 px
    bilinear = bicubic = square(2, 4)
    for _ in range(10):
        bilinear = warp(bilinear, left * 0.3)
        bicubic = warp(bicubic, left * 0.3, mode="bicubic").clamp(0, 1)
    row_bilinear, row_bicubic = bilinear[0, 0, 5], bicubic[0, 0, 5]
    assert row_bilinear.max() < 0.85 and row_bicubic.max() > 0.99  # bilinear has smeared the square
    for row in (row_bilinear, row_bicubic):  # both moved it about 3 px (centre of mass 3.5 -> ~6.5)
        centre = (row * torch.arange(12.0)).sum() / row.sum()
        assert centre == pytest.approx(6.5, abs=0.2)
    grads = []
    for mode in ("bilinear", "bicubic"):
        flow = (left * 0.3).requires_grad_()
        (warp(frame, flow, mode=mode) * square(6, 4)).sum().backward()
        grads.append(flow.grad)
    torch.testing.assert_close(grads[0], grads[1])
    for key in ("warp_read", "train_warp_read"):
        with pytest.raises(ValueError, match=f"dit.{key}='cubic'"):
            dit_config(warp_previous_frame=True, **{key: "cubic"}).validate()
        with pytest.raises(ValueError, match="warp_previous_frame"):
            dit_config(**{key: "bicubic"}).validate()


@pytest.mark.parametrize("read, train_read", [("bilinear", ""), ("bicubic", ""), ("bicubic", "bilinear")])
def test_the_output_path_reads_the_previous_frame_as_configured(read, train_read):
    """With zero change and a displacement of -0.3 px everywhere, the output is the previous frame read 0.3 px to
    the left, never a copy: in eval mode by warp_read, in train mode by train_warp_read ("" as warp_read)."""
    dit = VideoDiT(
        dit_config(
            warp_previous_frame=True, warp_read=read, train_warp_read=train_read, output_conv_channels=0
        )
    )
    prev = torch.zeros(1, 1, 1, 3, SIZE, SIZE)
    prev[..., 6:10, 6:10] = 1.0
    with torch.no_grad():
        dit.final.weight.zero_()
        dit.final.bias.zero_()
        dit.final.bias.view(-1, dit.cfg.channels + 2)[:, dit.cfg.channels] = -0.3
    tokens, cond = torch.zeros(1, dit.cfg.frame_len, dit.cfg.width), torch.zeros(1, 1, dit.cfg.width)
    flow = torch.zeros(1, 2, SIZE, SIZE)
    flow[:, 0] = -0.3
    for training, mode in ((False, read), (True, train_read or read)):
        out = dit.train(training).output(tokens, cond, prev, None)
        torch.testing.assert_close(out[0, 0, 0], warp(prev[0, 0], flow, mode=mode)[0])
        assert not torch.equal(out[0, 0, 0], prev[0, 0, 0])
    if train_read:  # the two reads differ, so the test tells them apart
        assert not torch.allclose(warp(prev[0, 0], flow, mode=read), warp(prev[0, 0], flow, mode=train_read))


@pytest.mark.parametrize("shift", [(1, 0), (-1, 0), (0, 1), (0, -1)])
def test_warp_gradient_points_the_displacement_toward_the_true_motion(shift):
    """A hard-edged square that truly moved one pixel: at zero displacement the loss's gradient asks for reading
    from where it came (x displacement -dx, y displacement -dy) in every direction. Bilinear reading's own
    gradient is zero for moves right and down."""
    dx, dy = shift
    frame = square(4, 4)
    flow = torch.zeros(1, 2, 12, 12, requires_grad=True)
    loss = (warp(frame, flow) - square(4 + dx, 4 + dy)).pow(2).sum()
    loss.backward()
    descent = -flow.grad.sum((0, 2, 3))
    assert descent[0] * dx < 0 if dx else descent[0].abs() < 1e-6
    assert descent[1] * dy < 0 if dy else descent[1].abs() < 1e-6
    frames = frame.clone().requires_grad_()  # the frames get bilinear reading's gradient
    warp(frames, torch.zeros(1, 2, 12, 12)).sum().backward()
    torch.testing.assert_close(frames.grad, torch.ones_like(frame))


def test_warped_residual_starts_as_the_previous_frame_and_can_move_it():
    dit = VideoDiT(dit_config(warp_previous_frame=True))
    assert dit.final.out_features == 4 * 4 * 5  # per pixel: three channels of change, then x, y
    x, prev, a, valid, t = dit_inputs(1, 2)
    out, _ = dit(x, prev, a, valid, t, torch.arange(2))
    torch.testing.assert_close(out, prev)  # zero displacement, zero change
    with torch.no_grad():
        dit.final.bias.view(-1, 5)[:, 3] = -1.0  # every pixel reads one to its left
    out, _ = dit(x, prev, a, valid, t, torch.arange(2))
    torch.testing.assert_close(out[..., 1:], prev[..., :-1])
    torch.testing.assert_close(out[..., 0], prev[..., 0])  # the border repeats
