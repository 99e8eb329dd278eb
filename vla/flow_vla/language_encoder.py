"""Instruction encoders: list of strings -> tokens [B, L, dim] and a padding mask [B, L] (True = padding)."""

from __future__ import annotations

import torch
from torch import nn

from worldloop.common.text import hashed_batch
from worldloop.vla.flow_vla.configuration_flow_vla import LanguageConfig


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

    def forward(self, texts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = hashed_batch(texts, self.buckets, self.max_words).to(device)
        pad = ids == 0
        return self.embed(ids) + self.pos, pad


def build_language_encoder(cfg: LanguageConfig, dim: int) -> nn.Module:
    if cfg.encoder == "hash":
        return HashWordEncoder(cfg, dim)
    from worldloop.vla.flow_vla.minilm import MiniLMInstructionEncoder

    return MiniLMInstructionEncoder(cfg, dim)
