"""Torch's global random generators, seeded for a block and restored after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Inside, torch's global generators (CPU and every CUDA device) start from `seed`; after, the caller's
    streams continue as if nothing had been drawn. A policy draws its sampling noise from them: an
    evaluation episode's outcome then depends on its seed alone, not on what ran before it (a world model
    built before the simulator evaluation shifted the policy's noise and with it several episodes in 50)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
