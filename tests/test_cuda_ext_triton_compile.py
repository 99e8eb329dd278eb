"""Every Triton kernel compiles for real GPUs (sm_80, sm_90) without a GPU: Triton's ahead-of-time path.

The interpreter tests check the kernels' arithmetic but not that Triton's compiler accepts them (types,
constexpr branches, shapes of tl.dot); this builds each kernel to PTX and cubin with the ptxas Triton ships.
"""

import inspect
import os

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="kernels are interpreted functions"),
]
FLOAT_ARGS = {"qk_scale_log2", "sm_scale", "eps", "guidance", "lo", "hi"}
FP32_POINTERS = {"LSE", "DELTA", "MEAN", "RSTD", "DT"}
INT_SIZES = {"H", "L", "C", "D"}  # upper-case like the pointers, but sizes


def _compile(kernel, constexprs: dict, dtype: str, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.isupper() and name not in INT_SIZES:  # pointers are the upper-case arguments
            signature[name] = "*fp32" if name in FP32_POINTERS else f"*{dtype}"
        else:
            signature[name] = "fp32" if name in FLOAT_ARGS else "i32"
    return triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32))


def _attention_cases():
    for name in ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"):
        for teacher_forced, window, head_block in ((False, False, 64), (True, True, 128)):
            yield (
                name,
                dict(
                    HAS_WINDOW=window,
                    TEACHER_FORCED=teacher_forced,
                    BLOCK_M=64,
                    BLOCK_N=32,
                    BLOCK_D=head_block,
                ),
            )


@pytest.mark.parametrize("arch", [80, 90])
@pytest.mark.parametrize("name, constexprs", list(_attention_cases()))
def test_attention_kernels_compile(name, constexprs, arch):
    from worldloop.cuda_ext.triton_kernels import attention

    compiled = _compile(getattr(attention, name), constexprs, "bf16", arch)
    assert compiled.asm["ptx"] and compiled.asm["cubin"]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_adaln_and_denoise_kernels_compile(dtype):
    from worldloop.cuda_ext.triton_kernels import adaln, denoise

    kernels = [
        (adaln._adaln_fwd, dict(HAS_RESIDUAL=True, BLOCK_C=1024)),
        (adaln._adaln_fwd, dict(HAS_RESIDUAL=False, BLOCK_C=256)),
        (adaln._adaln_bwd, dict(HAS_RESIDUAL=True, BLOCK_C=1024)),
        (adaln._adaln_bwd, dict(HAS_RESIDUAL=False, BLOCK_C=256)),
        (adaln._gated_residual_fwd, dict(BLOCK_C=1024)),
        (denoise._denoise_step_kernel, dict(HAS_UNCOND=True, HAS_FIRST=True, HAS_CLAMP=True, BLOCK=1024)),
        (denoise._denoise_step_kernel, dict(HAS_UNCOND=False, HAS_FIRST=False, HAS_CLAMP=False, BLOCK=1024)),
    ]
    for kernel, constexprs in kernels:
        assert _compile(kernel, constexprs, dtype, 90).asm["cubin"]
