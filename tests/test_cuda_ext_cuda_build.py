"""The CUDA C++ kernel: a clear message where it cannot be built, and an nvcc compile check where nvcc exists."""

import re
import subprocess
import sysconfig

import pytest
import torch

from worldloop.cuda_ext import cuda_build


def test_cuda_extension_explains_why_it_cannot_build_here():
    problem = cuda_build.cuda_build_problem()
    if problem is None:
        pytest.skip("this machine can build the CUDA extension")
    with pytest.raises(
        RuntimeError, match=re.escape(f"cannot build the CUDA C++ denoise_step kernel: {problem}")
    ):
        cuda_build.load_denoise_extension()


@pytest.mark.slow
def test_cuda_sources_compile_with_nvcc(tmp_path):
    nvcc = cuda_build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    kernel = subprocess.run(
        [
            nvcc,
            "-std=c++17",
            "-O3",
            "-c",
            str(cuda_build.CSRC / "denoise_step_kernel.cu"),
            "-o",
            str(tmp_path / "k.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert kernel.returncode == 0, kernel.stderr
    # The torch binding is host C++: check it against torch's headers (building it needs a CUDA device).
    from torch.utils.cpp_extension import include_paths

    toolkit_includes = [
        cuda_build.Path(nvcc).resolve().parents[1] / "include",
        cuda_build.Path("/usr/local/cuda/include"),
    ]
    cuda_include = next((str(p) for p in toolkit_includes if (p / "cuda_runtime.h").is_file()), None)
    assert cuda_include is not None, f"no cuda_runtime.h next to {nvcc} or in /usr/local/cuda/include"
    includes = [*include_paths(device_type="cuda"), sysconfig.get_paths()["include"], cuda_include]
    binding = subprocess.run(
        ["c++", "-std=c++17", "-fsyntax-only", *(f"-I{p}" for p in includes), "-DTORCH_EXTENSION_NAME=check",
         f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", str(cuda_build.CSRC / "denoise_step.cpp")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert binding.returncode == 0, binding.stderr[-4000:]
