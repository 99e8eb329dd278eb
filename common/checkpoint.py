"""Checkpoint directories written atomically and read without unpickling arbitrary objects.

A pretrained-model directory holds `config.yaml`, `model.safetensors` and `stats.json`. Writers build the
directory under a temporary name beside the target and rename it into place, so an interruption never
leaves a half-written checkpoint where a reader would find it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory; on success it replaces `path` (an existing one is swapped out)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
    os.replace(tmp, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_tensors(tensors: dict[str, torch.Tensor], path: str | Path) -> None:
    # safetensors refuses shared or non-contiguous storage: store independent contiguous copies.
    save_file({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}, str(path))


def load_tensors(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint weights {path} do not exist")
    return load_file(str(path), device=str(device))


def save_json(obj, path: str | Path) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True))


def load_json(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def save_torch(obj, path: str | Path) -> None:
    """For optimizer/scheduler/RNG state: plain containers of tensors and numbers only."""
    torch.save(obj, str(path))


def load_torch(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return torch.load(str(path), map_location="cpu", weights_only=True)


def load_model_weights(model: torch.nn.Module, path: str | Path, strict: bool = True) -> None:
    state = load_tensors(path)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and (missing or unexpected):
        raise ValueError(
            f"{path}: weights do not fit {type(model).__name__}: missing {sorted(missing)[:8]}, "
            f"unexpected {sorted(unexpected)[:8]}"
        )


def load_matching_weights(model: torch.nn.Module, path: str | Path) -> list[str]:
    """Load the tensors of `path` whose name and shape match the model's; return the names left as they
    were (new parts, or parts whose shape changed), after saying which.

    A layer's weight that has only gained inputs (a 2-D linear or 4-D convolution weight, larger in dim 1 and
    the same elsewhere; e.g. dit.previous_frames raised, whose extra frame's channels come after the old ones)
    takes the old weights for its old inputs and zeros for the new: the model starts computing what the one it
    came from computed, and training decides what the new inputs are worth. It counts as loaded."""
    state, own = load_tensors(path), model.state_dict()
    fitting = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    grown = {}
    for k, v in state.items():
        mine = own.get(k)
        if mine is None or k in fitting or v.dim() not in (2, 4) or mine.dim() != v.dim():
            continue
        if mine.shape[1] > v.shape[1] and mine.shape[:1] + mine.shape[2:] == v.shape[:1] + v.shape[2:]:
            weight = torch.zeros_like(mine)
            weight[:, : v.shape[1]] = v
            grown[k] = weight
    model.load_state_dict({**fitting, **grown}, strict=False)
    if grown:
        print(f"{path}: new inputs start at zero in {', '.join(sorted(grown))}")
    fresh = sorted(k for k in own if k not in fitting and k not in grown)
    if fresh:
        print(f"{path}: {len(fitting) + len(grown)} tensors loaded; kept fresh: {', '.join(fresh[:12])}")
    return fresh
