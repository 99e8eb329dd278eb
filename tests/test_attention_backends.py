"""The world model's attention backends on CPU: FlexAttention (eager) and its block mask against the dense
SDPA reference, the backend choice, and the block-mask cache. The Triton backend is checked in the Triton
interpreter (tests/test_cuda_ext_triton_interpret.py), on CUDA by tests/test_cuda_ext_gpu.py."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from worldloop.cuda_ext.attention import (
    block_causal_attention_reference,
    flex_block_causal_attention,
    frame_block_mask,
    frame_causal_mask,
)
from worldloop.world_model.attention import frame_attention, resolve_backend
from worldloop.world_model.dit import VideoDiT, VideoDiTConfig

CPU = torch.device("cpu")
# (q_len, k_len, frame_len, window, teacher_forced, block_size): tiles straddling frames, frames spanning
# tiles, lengths not a multiple of the tile, decode (q shorter than k), both layouts
MASK_CASES = [
    (40, 40, 6, None, False, 8),
    (40, 40, 6, 2, False, 8),
    (37, 37, 5, None, False, 16),
    (12, 48, 12, 3, False, 8),
    (20, 53, 5, 2, False, 8),
    (45, 45, 5, 2, True, 8),
    (70, 70, 10, None, True, 16),
    (27, 27, 9, 1, True, 4),
    (84, 84, 4, 50, True, 16),
]


@pytest.mark.parametrize("q_len, k_len, frame_len, window, teacher_forced, block_size", MASK_CASES)
def test_block_mask_matches_create_block_mask_of_the_dense_mask(
    q_len, k_len, frame_len, window, teacher_forced, block_size
):
    dense = frame_causal_mask(q_len, k_len, frame_len, window, CPU, teacher_forced)
    expected = create_block_mask(
        lambda b, h, q, k: dense[q, k], None, None, q_len, k_len, device="cpu", BLOCK_SIZE=block_size
    )
    got = frame_block_mask(q_len, k_len, frame_len, window, CPU, teacher_forced, block_size)
    assert got.seq_lengths == (q_len, k_len)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    # the mask_mod the kernel applies inside partial tiles is the dense rule
    q_idx, k_idx = torch.arange(q_len)[:, None], torch.arange(k_len)[None, :]
    assert torch.equal(got.mask_mod(0, 0, q_idx, k_idx), dense)


def _qkv(batch, heads, q_len, k_len, dim, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, dim, generator=g, dtype=torch.float64).requires_grad_()
    k, v = (
        torch.randn(batch, heads, k_len, dim, generator=g, dtype=torch.float64).requires_grad_() for _ in "kv"
    )
    return q, k, v


@pytest.mark.parametrize(
    "q_len, k_len, frame_len, window, teacher_forced",
    [(45, 45, 5, 3, True), (42, 42, 6, None, True), (40, 40, 8, 2, False), (8, 40, 8, None, False)],
)
def test_flex_matches_dense_sdpa_forward_and_backward(q_len, k_len, frame_len, window, teacher_forced):
    q, k, v = _qkv(2, 3, q_len, k_len, 16)
    out = flex_block_causal_attention(q, k, v, frame_len, window, teacher_forced=teacher_forced)
    ref = block_causal_attention_reference(q, k, v, frame_len, window, teacher_forced=teacher_forced)
    grad = torch.randn_like(out)
    torch.testing.assert_close(out, ref)
    for got, expected in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)
    ):
        torch.testing.assert_close(got, expected)


def test_block_mask_is_built_once_per_shape_and_shared_across_batch_sizes():
    frame_block_mask.cache_clear()
    for batch in (2, 5, 1, 2):
        q, k, v = _qkv(batch, 2, 25, 25, 8)
        frame_attention(q, k, v, frame_len=5, context=1, teacher_forced=True, backend="flex")
    info = frame_block_mask.cache_info()
    assert (info.misses, info.hits) == (1, 3)
    mask = frame_block_mask(25, 25, 5, 2, CPU, True)
    assert mask.kv_num_blocks.shape[:2] == (1, 1)  # batch and heads broadcast
    q, k, v = _qkv(1, 2, 15, 15, 8)  # another shape: a second mask
    frame_attention(q, k, v, frame_len=5, context=1, backend="flex")
    assert frame_block_mask.cache_info().misses == 2


def test_auto_backend_choice(monkeypatch):
    monkeypatch.delenv("WORLDLOOP_KERNELS", raising=False)
    cuda = torch.device("cuda")
    assert resolve_backend("auto", CPU) == "sdpa"
    assert resolve_backend("auto", cuda) == "triton"
    assert resolve_backend("flex", CPU) == "flex"
    monkeypatch.setenv("WORLDLOOP_KERNELS", "off")
    assert resolve_backend("auto", cuda) == "sdpa"


def test_unknown_backend_names_the_field_and_the_choices():
    with pytest.raises(
        ValueError, match=r"dit.attention_backend='xformers'.*'auto', 'sdpa', 'flex', 'triton'"
    ):
        VideoDiT(VideoDiTConfig(attention_backend="xformers"))
    with pytest.raises(ValueError, match="'cuda_ext' is now 'triton'"):
        VideoDiTConfig(attention_backend="cuda_ext").validate()


def test_flex_under_autocast_takes_mixed_dtypes():
    q, k, v = (t.detach().float() for t in _qkv(1, 2, 25, 25, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = frame_attention(q, k, v.bfloat16(), frame_len=5, context=2, teacher_forced=True, backend="flex")
    assert out.dtype == torch.bfloat16
    ref = block_causal_attention_reference(q, k, v, 5, 3, teacher_forced=True)
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)


def test_dit_training_pass_with_flex_equals_sdpa():
    """The whole teacher-forced DiT pass (forward and parameter gradients) is backend-independent."""
    cfg = dict(
        image_size=16, patch_size=8, width=32, depth=2, heads=2, context_frames=2, output_conv_channels=0
    )
    torch.manual_seed(0)
    dit = VideoDiT(VideoDiTConfig(attention_backend="sdpa", **cfg))
    for p in dit.parameters():  # AdaLN and the output layers start at zero: make every path carry signal
        torch.nn.init.normal_(p, std=0.2)
    clean_frames, frames = 3, 5  # teacher-forced: T clean frames, then T - 1 noisy ones
    x, prev = torch.randn(2, frames, 1, 3, 16, 16), torch.randn(2, frames, 1, 3, 16, 16)
    a, t = torch.randn(2, frames, 4), torch.rand(2, frames)
    valid = torch.ones(2, frames, dtype=torch.bool)
    index = torch.cat([torch.arange(clean_frames), torch.arange(1, clean_frames)])
    results = []
    for backend in ("sdpa", "flex"):
        dit.cfg.attention_backend = backend
        out, _ = dit(x, prev, a, valid, t, index, teacher_forced=True)
        results.append((out, torch.autograd.grad(out.square().mean(), list(dit.parameters()))))
    (out_sdpa, grads_sdpa), (out_flex, grads_flex) = results
    torch.testing.assert_close(out_flex, out_sdpa, atol=1e-5, rtol=1e-5)
    for got, expected in zip(grads_flex, grads_sdpa):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.slow
def test_compiled_flex_on_cpu_uses_the_block_mask_tiles():
    """torch.compile'd FlexAttention (forward; 2.10 has no compiled CPU backward) skips empty tiles and the
    mask_mod in full ones, so this checks the tile classification in a real kernel (~30 s to compile)."""
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (t.detach().float() for t in _qkv(2, 2, 7 * 64, 7 * 64, 16))
    mask = frame_block_mask(7 * 64, 7 * 64, 64, 2, CPU, True)
    with torch.no_grad():
        out = torch.compile(flex_attention)(q, k, v, block_mask=mask)
    ref = block_causal_attention_reference(q, k, v, 64, 2, teacher_forced=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
