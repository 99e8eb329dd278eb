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
