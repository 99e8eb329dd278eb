"""The PyTorch reference paths of cuda_ext and the backend dispatch (CPU, no Triton needed)."""

import math

import pytest
import torch

from worldloop import cuda_ext
from worldloop.cuda_ext.adaln import adaln_modulate_reference
from worldloop.cuda_ext.attention import block_causal_attention_reference
from worldloop.cuda_ext.backend import requested_backend, resolve_backend
from worldloop.cuda_ext.denoise import denoise_step_reference


def naive_attention(q, k, v, frame_len, window=None):
    """Loop over queries: softmax over exactly the keys the frame rule allows."""
    lq, lk = q.shape[-2], k.shape[-2]
    out = torch.zeros_like(q)
    for j in range(lq):
        frame = (lk - lq + j) // frame_len
        first = 0 if window is None else max(0, (frame - window + 1) * frame_len)
        last = min(lk, (frame + 1) * frame_len)
        scores = q[..., j : j + 1, :] @ k[..., first:last, :].transpose(-1, -2) / math.sqrt(q.shape[-1])
        out[..., j : j + 1, :] = scores.softmax(-1) @ v[..., first:last, :]
    return out


@pytest.mark.parametrize(
    "lq, lk, frame_len, window",
    [(12, 12, 4, None), (12, 12, 4, 2), (4, 12, 4, None), (8, 20, 4, 2), (5, 5, 5, None), (9, 9, 3, 10)],
)
def test_reference_attention_matches_naive_loop(lq, lk, frame_len, window):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, lq, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, lk, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, lk, 8, generator=g, dtype=torch.float64)
    got = cuda_ext.block_causal_attention(q, k, v, frame_len, window=window)
    torch.testing.assert_close(got, naive_attention(q, k, v, frame_len, window))


def test_mask_is_frame_causal():
    mask = cuda_ext.frame_causal_mask(6, 6, 2, None, torch.device("cpu"))
    expected = torch.tensor([[1, 1, 0, 0, 0, 0]] * 2 + [[1, 1, 1, 1, 0, 0]] * 2 + [[1] * 6] * 2).bool()
    assert torch.equal(mask, expected)
    windowed = cuda_ext.frame_causal_mask(2, 6, 2, 2, torch.device("cpu"))
    assert torch.equal(windowed, torch.tensor([[0, 0, 1, 1, 1, 1]] * 2).bool())


def test_teacher_forced_mask_matches_its_definition():
    clean, frame_len, window = 4, 2, 2
    mask = cuda_ext.frame_causal_mask(14, 14, frame_len, window, torch.device("cpu"), teacher_forced=True)
    # frame index -> (time, noisy): clean frames 0..3 have times 0..3, noisy frames 4..6 have times 1..3
    frames = [(f, False) for f in range(clean)] + [(t, True) for t in range(1, clean)]
    for qf, (tq, nq) in enumerate(frames):
        for kf, (tk, nk) in enumerate(frames):
            if nk:
                expected = nq and tk == tq
            else:
                expected = tq - window < tk <= (tq - 1 if nq else tq)
            block = mask[qf * frame_len : (qf + 1) * frame_len, kf * frame_len : (kf + 1) * frame_len]
            assert bool(block.all()) == expected and bool(block.any()) == expected, (qf, kf)
    with pytest.raises(ValueError, match="teacher_forced needs"):
        q = torch.randn(1, 1, 8, 4)  # 4 frames: not 2T - 1
        cuda_ext.block_causal_attention(q, q, q, 2, teacher_forced=True)


def test_decode_equals_last_frame_of_full_attention():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 15, 16, generator=g) for _ in range(3))
    full = cuda_ext.block_causal_attention(q, k, v, frame_len=5, window=2)
    decode = cuda_ext.block_causal_attention(q[:, :, -5:], k, v, frame_len=5, window=2)
    torch.testing.assert_close(decode, full[:, :, -5:])


def test_attention_rejects_bad_input():
    q = torch.randn(1, 2, 8, 4)
    with pytest.raises(ValueError, match="q must be"):
        cuda_ext.block_causal_attention(q[0], q, q, 4)
    with pytest.raises(ValueError, match="last positions"):
        cuda_ext.block_causal_attention(q, q[:, :, :4], q[:, :, :4], 4)
    with pytest.raises(ValueError, match="window"):
        cuda_ext.block_causal_attention(q, q, q, 4, window=0)


def test_adaln_modulate_and_gated_residual():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 5, generator=g, dtype=torch.float64)
    shift, scale, gate = (torch.randn(2, 3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    out = cuda_ext.adaln_modulate(x, shift, scale, frame_len=2)
    mean = x.mean(-1, keepdim=True)
    normed = (x - mean) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-6)
    per_token = lambda c: c.repeat_interleave(2, dim=1)  # noqa: E731
    torch.testing.assert_close(out, normed * (1 + per_token(scale)) + per_token(shift))
    y = torch.randn_like(x)
    torch.testing.assert_close(cuda_ext.gated_residual(x, y, gate, frame_len=2), x + per_token(gate) * y)
    new_x, h = cuda_ext.gated_residual_adaln(x, y, gate, shift, scale, frame_len=2)
    torch.testing.assert_close(new_x, x + per_token(gate) * y)
    torch.testing.assert_close(h, cuda_ext.adaln_modulate(new_x, shift, scale, frame_len=2))
    with pytest.raises(ValueError, match="multiple of frame_len"):
        cuda_ext.adaln_modulate(x, shift, scale, frame_len=4)
    with pytest.raises(ValueError, match=r"scale must be \[B, F, C\]"):
        cuda_ext.adaln_modulate(x, shift, scale[:, :2], frame_len=2)


def test_denoise_step_euler_cfg_heun_clamp():
    x = torch.tensor([[0.0, 1.0], [2.0, -3.0]])
    vc = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    vu = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    torch.testing.assert_close(cuda_ext.denoise_step(x, vc, 0.5), x + 0.5)
    # guidance 3: v = vu + 3 (vc - vu) -> 3 for the first sample, -1 for the second
    cfg = cuda_ext.denoise_step(x, vc, 0.5, v_uncond=vu, guidance_scale=3.0)
    torch.testing.assert_close(cfg, torch.tensor([[1.5, 2.5], [1.5, -3.5]]))
    per_sample = cuda_ext.denoise_step(x, vc, torch.tensor([1.0, -1.0]), clamp=(-3.0, 1.5))
    torch.testing.assert_close(per_sample, torch.tensor([[1.0, 1.5], [1.0, -3.0]]))
    heun = cuda_ext.denoise_step(x, vc, 0.5, v_first=torch.full_like(x, 3.0))
    torch.testing.assert_close(heun, x + 0.5 * 2.0)
    with pytest.raises(ValueError, match="v_uncond"):
        cuda_ext.denoise_step(x, vc, 0.5, v_uncond=vu[:1])


def test_dispatch_picks_reference_on_cpu(monkeypatch):
    monkeypatch.delenv("WORLDLOOP_KERNELS", raising=False)
    cpu = torch.device("cpu")
    assert requested_backend() == "auto"
    assert resolve_backend("op", None, cpu) == "reference"
    assert resolve_backend("op", None, torch.device("cuda"), has_cuda_extension=True) in (
        "triton",
        "reference",
    )
    monkeypatch.setenv("WORLDLOOP_KERNELS", "off")
    assert resolve_backend("op", None, torch.device("cuda")) == "reference"


def test_env_override_forces_a_path_or_fails_clearly(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("WORLDLOOP_KERNELS", "triton")
    q = torch.randn(1, 1, 4, 4)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        cuda_ext.block_causal_attention(q, q, q, 2)
    # the argument wins over the environment
    torch.testing.assert_close(
        cuda_ext.block_causal_attention(q, q, q, 2, backend="off"),
        block_causal_attention_reference(q, q, q, 2),
    )
    monkeypatch.setenv("WORLDLOOP_KERNELS", "cuda")
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        cuda_ext.denoise_step(q, q, 0.1)
    monkeypatch.setenv("WORLDLOOP_KERNELS", "fast")
    with pytest.raises(ValueError, match="WORLDLOOP_KERNELS='fast'"):
        cuda_ext.denoise_step(q, q, 0.1)


def test_inputs_the_kernels_cannot_take(monkeypatch):
    monkeypatch.delenv("WORLDLOOP_KERNELS", raising=False)
    cuda = torch.device("cuda")
    # auto quietly keeps such inputs on the reference, a forced kernel backend says why it cannot run
    assert resolve_backend("op", None, cuda, unsupported="dtype torch.float64") == "reference"
    with pytest.raises(ValueError, match="cannot take these inputs: dtype torch.float64"):
        resolve_backend("op", "triton", cuda, unsupported="dtype torch.float64")
    x = torch.randn(1, 4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="float64"):
        cuda_ext.adaln_modulate(x, x[:, :2], x[:, :2], 2, backend="triton")


def test_references_are_differentiable():
    q = torch.randn(1, 2, 6, 4, requires_grad=True)
    block_causal_attention_reference(q, q, q, 3).sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    x = torch.randn(1, 4, 3, requires_grad=True)
    shift = torch.zeros(1, 2, 3, requires_grad=True)
    adaln_modulate_reference(x, shift, shift, 2).square().sum().backward()
    assert x.grad is not None and shift.grad is not None
    denoise_step_reference(x, x, 0.1).sum().backward()
