"""worldloop custom kernels: one dispatch function per op, each with a PyTorch reference.

The world model calls only these functions. On CUDA tensors they run Triton kernels (or the CUDA C++
extension), elsewhere the PyTorch reference; `WORLDLOOP_KERNELS=off|triton|cuda|auto` forces a path
(see `cuda_ext.backend`). Nothing here is required on CPU: Triton is imported only when a kernel runs.
"""

from worldloop.cuda_ext.adaln import adaln_modulate, gated_residual, gated_residual_adaln
from worldloop.cuda_ext.attention import block_causal_attention, frame_causal_mask
from worldloop.cuda_ext.backend import BACKENDS, resolve_backend
from worldloop.cuda_ext.denoise import denoise_step, guided_velocity

__all__ = [
    "BACKENDS",
    "adaln_modulate",
    "block_causal_attention",
    "denoise_step",
    "frame_causal_mask",
    "gated_residual",
    "gated_residual_adaln",
    "guided_velocity",
    "resolve_backend",
]
