"""Just-in-time build of the CUDA C++ kernels (torch.utils.cpp_extension.load), with a clear error elsewhere.

The build needs a CUDA device, a CUDA build of torch and an nvcc whose major version matches torch's CUDA;
it is cached by torch under ~/.cache/torch_extensions (or $TORCH_EXTENSIONS_DIR) after the first call.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import torch

CSRC = Path(__file__).resolve().parent / "csrc"
DENOISE_SOURCES = (CSRC / "denoise_step.cpp", CSRC / "denoise_step_kernel.cu")


def find_nvcc() -> str | None:
    """Path of nvcc: $CUDA_HOME/bin (as torch finds it), then PATH, then /usr/local/cuda/bin."""
    from torch.utils.cpp_extension import CUDA_HOME

    for candidate in (
        Path(CUDA_HOME) / "bin" / "nvcc" if CUDA_HOME else None,
        Path(shutil.which("nvcc")) if shutil.which("nvcc") else None,
        Path("/usr/local/cuda/bin/nvcc"),
    ):
        if candidate is not None and candidate.is_file():
            return str(candidate)
    return None


def cuda_build_problem() -> str | None:
    """Why the CUDA C++ extension cannot be built here, or None when it can."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return "no CUDA device is available"
    if find_nvcc() is None:
        return "nvcc was not found (set CUDA_HOME or put the CUDA toolkit's bin/ on PATH)"
    return None


@functools.cache
def load_denoise_extension():
    """Build (first call) and import the fused denoise-step extension; RuntimeError says why it cannot."""
    problem = cuda_build_problem()
    if problem is not None:
        raise RuntimeError(f"cuda_ext: cannot build the CUDA C++ denoise_step kernel: {problem}")
    from torch.utils.cpp_extension import load

    try:
        return load(
            name="worldloop_denoise_step",
            sources=[str(p) for p in DENOISE_SOURCES],
            extra_cuda_cflags=["-O3"],
            verbose=False,
        )
    except (RuntimeError, OSError) as err:
        raise RuntimeError(
            f"cuda_ext: building {', '.join(p.name for p in DENOISE_SOURCES)} failed "
            f"(torch CUDA {torch.version.cuda}, nvcc {find_nvcc()}): {err}"
        ) from err
