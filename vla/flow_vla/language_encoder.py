"""Instruction encoders: list of strings -> tokens [B, L, dim] and a padding mask [B, L] (True = padding)."""

from __future__ import annotations

import re
import zlib

import torch
from torch import nn

from vla.flow_vla.configuration_flow_vla import LanguageConfig

_WORD = re.compile(r"[a-z0-9]+")


class HashWordEncoder(nn.Module):
    """Lower-cased words hashed (crc32, stable across processes) into a trainable embedding table.

    No vocabulary file to ship: unseen words still get a bucket, and the same instruction always maps to
    the same ids. Index 0 is padding.
    """

    def __init__(self, cfg: LanguageConfig, dim: int):
        super().__init__()
        self.buckets = cfg.vocab_buckets
        self.max_words = cfg.max_words
        self.embed = nn.Embedding(cfg.vocab_buckets + 1, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(cfg.max_words, dim) * 0.02)

    def token_ids(self, text: str) -> list[int]:
        words = _WORD.findall(text.lower())[: self.max_words] or ["<empty>"]
        return [1 + zlib.crc32(w.encode()) % self.buckets for w in words]

    def forward(self, texts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.zeros(len(texts), self.max_words, dtype=torch.long)
        for i, text in enumerate(texts):
            row = self.token_ids(text)
            ids[i, : len(row)] = torch.tensor(row)
        ids = ids.to(device)
        pad = ids == 0
        return self.embed(ids) + self.pos, pad


def build_language_encoder(cfg: LanguageConfig, dim: int) -> nn.Module:
    if cfg.encoder == "hash":
        return HashWordEncoder(cfg, dim)
    from vla.flow_vla.minilm import MiniLMInstructionEncoder

    return MiniLMInstructionEncoder(cfg, dim)
