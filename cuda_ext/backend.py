"""Which implementation an op runs: the PyTorch reference, a Triton kernel or the CUDA C++ extension.

`WORLDLOOP_KERNELS` (or an op's `backend=` argument, which wins) picks the path:

- `auto` (default): the Triton kernel for CUDA tensors when Triton is installed and the kernel takes the
  inputs (dtype fp32/fp16/bf16, sizes within its limits), the reference elsewhere.
- `off`: always the PyTorch reference.
- `triton`: always the Triton kernel. CPU tensors need `TRITON_INTERPRET=1` (the Triton interpreter, for tests).
- `cuda`: the CUDA C++ extension for ops that have one (`denoise_step`), Triton for the others.

Forcing a path that cannot run raises instead of silently falling back, so a benchmark or a test never
measures something other than what it asked for.
"""

from __future__ import annotations

import importlib.util
import os

import torch

ENV_VAR = "WORLDLOOP_KERNELS"
BACKENDS = ("auto", "off", "triton", "cuda")


def requested_backend(backend: str | None = None) -> str:
    """The backend asked for: the argument if given, else `$WORLDLOOP_KERNELS`, else `auto`."""
    source = "backend argument" if backend is not None else f"${ENV_VAR}"
    name = backend if backend is not None else os.environ.get(ENV_VAR, "auto")
    name = name.strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"{source}={name!r} is not a kernel backend; expected one of {', '.join(BACKENDS)}")
    return name


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_interpreter_enabled() -> bool:
    """True when Triton runs kernels in its NumPy interpreter (must be set before triton is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The AdaLN kernels hold one token row in registers: the dispatch (cuda_ext.adaln) sends wider rows to the
# reference, the kernel (cuda_ext.triton_kernels.adaln) refuses them.
ADALN_MAX_CHANNELS = 16384


def unsupported_dtype(dtype: torch.dtype) -> str | None:
    """Why the kernels cannot take `dtype`, or None."""
    return None if dtype in KERNEL_DTYPES else f"dtype {dtype} (kernels take float32, float16, bfloat16)"


def resolve_backend(
    op: str,
    backend: str | None,
    device: torch.device,
    has_cuda_extension: bool = False,
    unsupported: str | None = None,
) -> str:
    """The implementation `op` runs for tensors on `device`: 'reference', 'triton' or 'cuda'.

    `unsupported` says why the kernels cannot take these inputs (None when they can): `auto` then uses the
    reference, a forced kernel backend raises.
    """
    name = requested_backend(backend)
    if name == "off":
        return "reference"
    if name == "auto":
        usable = device.type == "cuda" and triton_available() and unsupported is None
        return "triton" if usable else "reference"
    if unsupported is not None:
        raise ValueError(f"{op}: backend '{name}' cannot take these inputs: {unsupported}")
    if name == "cuda" and has_cuda_extension:
        if device.type != "cuda":
            raise RuntimeError(f"{op}: backend 'cuda' needs CUDA tensors, got tensors on {device}")
        return "cuda"
    if not triton_available():
        raise RuntimeError(f"{op}: backend '{name}' needs Triton; install it with `pip install triton`")
    if device.type != "cuda" and not triton_interpreter_enabled():
        raise RuntimeError(
            f"{op}: backend '{name}' runs Triton, which needs CUDA tensors (got {device}); "
            "set TRITON_INTERPRET=1 before importing triton to run it on CPU in the interpreter"
        )
    return "triton"
