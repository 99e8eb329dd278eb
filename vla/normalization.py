"""Mean/std normalisation held inside a policy as buffers, so a checkpoint carries its own statistics.

Statistics come in the LeRobot `stats.json` shape: {feature: {"mean": [...], "std": [...], ...}}; other
entries (min, max, count, ...) are kept out of the way.
"""

from __future__ import annotations

import torch
from torch import nn

_EPS = 1e-6


class MeanStdNormalizer(nn.Module):
    def __init__(self, dims: dict[str, int], stats: dict | None = None):
        super().__init__()
        self.dims = dict(dims)
        for key, dim in self.dims.items():
            mean, std = torch.zeros(dim), torch.ones(dim)
            if stats is not None:
                mean, std = _read(stats, key, dim)
            self.register_buffer(self._name(key, "mean"), mean)
            self.register_buffer(self._name(key, "std"), std)

    @staticmethod
    def _name(key: str, what: str) -> str:
        return f"{key.replace('.', '_')}_{what}"

    def _get(self, key: str) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.dims:
            raise KeyError(f"no normalisation statistics for {key!r}; have {sorted(self.dims)}")
        return getattr(self, self._name(key, "mean")), getattr(self, self._name(key, "std"))

    def normalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._get(key)
        return (x - mean) / (std + _EPS)

    def unnormalize(self, key: str, x: torch.Tensor) -> torch.Tensor:
        mean, std = self._get(key)
        return x * (std + _EPS) + mean

    def stats_dict(self) -> dict:
        out = {}
        for key in self.dims:
            mean, std = self._get(key)
            out[key] = {"mean": mean.tolist(), "std": std.tolist()}
        return out


def _read(stats: dict, key: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if key not in stats:
        raise KeyError(f"stats: no entry for {key!r}; have {sorted(stats)}")
    out = []
    for what in ("mean", "std"):
        if what not in stats[key]:
            raise KeyError(f"stats[{key!r}]: missing {what!r}; have {sorted(stats[key])}")
        value = torch.as_tensor(stats[key][what], dtype=torch.float32).flatten()
        if value.numel() != dim:
            raise ValueError(f"stats[{key!r}][{what!r}]: expected {dim} values, got {value.numel()}")
        out.append(value)
    return out[0], out[1]
