"""The kernels on a real GPU (fp16/bf16 against the fp32 reference). Run with `pytest -m gpu` on a CUDA machine."""

import pytest
import torch

from worldloop import cuda_ext
from worldloop.cuda_ext.adaln import adaln_modulate_reference, gated_residual_adaln_reference
from worldloop.cuda_ext.attention import block_causal_attention_reference
from worldloop.cuda_ext.backend import resolve_backend
from worldloop.cuda_ext.denoise import denoise_step_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
DTYPES = [torch.float16, torch.bfloat16]


def _close(got, expected, dtype):
    tol = 2e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)


def test_auto_dispatch_runs_triton_on_cuda(monkeypatch):
    monkeypatch.delenv("WORLDLOOP_KERNELS", raising=False)
    assert resolve_backend("op", None, torch.device("cuda")) == "triton"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize(
    "lq, lk, frame_len, window", [(1000, 1000, 100, None), (1024, 1024, 64, 4), (256, 4096, 256, None)]
)
def test_attention_forward_backward(dtype, head_dim, lq, lk, frame_len, window):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(2, 4, lq, head_dim, device="cuda", dtype=dtype, generator=g).requires_grad_()
    k, v = (
        torch.randn(2, 4, lk, head_dim, device="cuda", dtype=dtype, generator=g).requires_grad_()
        for _ in range(2)
    )
    out = cuda_ext.block_causal_attention(q, k, v, frame_len, window, backend="triton")
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = block_causal_attention_reference(q32, k32, v32, frame_len, window)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    _close(out, ref, dtype)
    for got, expected in zip(grads, ref_grads):
        _close(got, expected, dtype)
    with torch.no_grad():  # inference decode takes the split-KV path
        decode = cuda_ext.block_causal_attention(
            q[:, :, -frame_len:], k, v, frame_len, window, backend="triton"
        )
    _close(decode, ref[:, :, -frame_len:], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adaln_and_fused_residual(dtype):
    g = torch.Generator(device="cuda").manual_seed(1)
    x, y = (
        torch.randn(4, 16 * 64, 384, device="cuda", dtype=dtype, generator=g).requires_grad_()
        for _ in range(2)
    )
    gate, shift, scale = (
        torch.randn(4, 16, 384, device="cuda", dtype=dtype, generator=g).requires_grad_() for _ in range(3)
    )
    out = cuda_ext.adaln_modulate(x, shift, scale, 64, backend="triton")
    _close(out, adaln_modulate_reference(x.float(), shift.float(), scale.float(), 64), dtype)
    new_x, h = cuda_ext.gated_residual_adaln(x, y, gate, shift, scale, 64, backend="triton")
    ref_x, ref_h = gated_residual_adaln_reference(*(t.float() for t in (x, y, gate, shift, scale)), 64)
    _close(new_x, ref_x, dtype)
    _close(h, ref_h, dtype)
    inputs = (x, y, gate, shift, scale)
    grads = torch.autograd.grad(h.float().square().mean(), inputs)
    refs32 = [t.detach().float().requires_grad_() for t in inputs]
    ref_grads = torch.autograd.grad(gated_residual_adaln_reference(*refs32, 64)[1].square().mean(), refs32)
    for got, expected in zip(grads, ref_grads):
        _close(got, expected, dtype)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, *DTYPES])
def test_denoise_step(backend, dtype):
    if backend == "cuda":
        from worldloop.cuda_ext.cuda_build import cuda_build_problem

        if cuda_build_problem() is not None:
            pytest.skip(cuda_build_problem())
    g = torch.Generator(device="cuda").manual_seed(2)
    x, vc, vu, vf = (torch.randn(8, 4, 3, 32, 32, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    dt = torch.linspace(-0.5, 0.5, 8, device="cuda")
    kwargs = dict(v_uncond=vu, guidance_scale=2.0, clamp=(-1.0, 1.0), v_first=vf)
    out = cuda_ext.denoise_step(x, vc, dt, backend=backend, **kwargs)
    ref = denoise_step_reference(x.float(), vc.float(), dt, vu.float(), 2.0, (-1.0, 1.0), vf.float())
    _close(out, ref, dtype)


# FlexAttention compiles per shape and dtype (seconds each): bf16 only, the training precision.
@pytest.mark.parametrize(
    "implementation, dtype", [("flex", torch.bfloat16), ("triton", torch.float16), ("triton", torch.bfloat16)]
)
@pytest.mark.parametrize(
    "length, frame_len, window, teacher_forced",
    [
        (23 * 256, 256, 9, True),
        (15 * 100, 100, None, True),
        (16 * 256, 256, None, False),
        (1000, 100, 4, False),
    ],
)
def test_training_attention_forward_backward(
    dtype, implementation, length, frame_len, window, teacher_forced
):
    """FlexAttention (block mask from the frame rule) and our kernel against the fp32 dense-mask reference."""
    from worldloop.cuda_ext.attention import flex_block_causal_attention

    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (
        torch.randn(2, 4, length, 64, device="cuda", dtype=dtype, generator=g).requires_grad_()
        for _ in range(3)
    )
    if implementation == "flex":
        out = flex_block_causal_attention(q, k, v, frame_len, window, teacher_forced=teacher_forced)
    else:
        out = cuda_ext.block_causal_attention(
            q, k, v, frame_len, window, backend="triton", teacher_forced=teacher_forced
        )
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = block_causal_attention_reference(q32, k32, v32, frame_len, window, teacher_forced=teacher_forced)
    ref_grads = torch.autograd.grad(ref, (q32, k32, v32), grad.float())
    _close(out, ref, dtype)
    for got, expected in zip(grads, ref_grads):
        _close(got, expected, dtype)


def test_flex_does_not_recompile_when_only_the_batch_changes():
    import torch._dynamo

    from worldloop.cuda_ext.attention import flex_block_causal_attention, frame_block_mask

    frame_block_mask.cache_clear()
    for batch in (2, 3, 8, 5):
        q, k, v = (
            torch.randn(batch, 4, 7 * 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        # the first batch size compiles; any other (> 1) must reuse it
        with torch._dynamo.config.patch(error_on_recompile=batch != 2):
            out = flex_block_causal_attention(q, k, v, 256, 3, teacher_forced=True)
            out.float().square().mean().backward()
    assert frame_block_mask.cache_info().misses == 1


def _tiny_world_model(backend: str):
    from worldloop.world_model.configuration_world_model import WorldModelConfig
    from worldloop.world_model.dit import VideoDiTConfig
    from worldloop.world_model.model import WorldModel

    torch.manual_seed(0)
    dit = VideoDiTConfig(
        image_size=32, num_views=2, patch_size=8, width=128, depth=2, heads=2, context_frames=3,
        attention_backend=backend,
    )  # fmt: skip
    model = WorldModel(WorldModelConfig(dit=dit, cameras=("front", "wrist"))).cuda()
    for (
        p
    ) in model.dit.parameters():  # AdaLN and the output layers start at zero: make every path carry signal
        torch.nn.init.normal_(p, std=0.05)
    return model


def test_world_model_auto_backend_matches_sdpa_in_bf16_training_and_cached_rollout():
    """`attention_backend: auto` (our kernel for training and for the KV-cache rollout) against
    the dense-mask reference: the bf16-autocast training loss and its gradients, and a rollout."""
    g = torch.Generator(device="cuda").manual_seed(4)
    frames = torch.rand(2, 6, 2, 3, 32, 32, device="cuda", generator=g)
    actions = torch.randn(2, 6, 4, device="cuda", generator=g)
    losses, grads, rollouts = [], [], []
    for backend in ("auto", "sdpa"):
        model = _tiny_world_model(backend)
        torch.manual_seed(1)  # the same noise draws for both
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = model.compute_loss(frames, actions)
        losses.append(loss.float())
        grads.append(torch.autograd.grad(loss, list(model.dit.parameters())))
        gen = torch.Generator(device="cuda").manual_seed(5)
        rollouts.append(
            model.rollout(frames[:, :3], actions[:, :2], actions[:, 2:], steps=2, generator=gen)[0]
        )
    torch.testing.assert_close(losses[0], losses[1], atol=2e-2, rtol=2e-2)
    for got, expected in zip(*grads):  # bf16: each parameter's gradient within 5% (relative norm)
        assert (got.float() - expected.float()).norm() <= 0.05 * expected.float().norm() + 1e-6
    torch.testing.assert_close(rollouts[0], rollouts[1], atol=1e-2, rtol=1e-2)
