"""Instruction text as stable integer ids, for the models that read the task without a tokenizer file."""

from __future__ import annotations

import re
import zlib

import torch

_WORD = re.compile(r"[a-z0-9]+")


def hash_words(text: str, buckets: int, max_words: int) -> list[int]:
    """Lower-cased words hashed (crc32: stable across processes and machines) into ids 1..buckets; 0 is
    left for padding. Unseen words still get a bucket, and the same instruction always maps to the same ids."""
    words = _WORD.findall(text.lower())[:max_words] or ["<empty>"]
    return [1 + zlib.crc32(w.encode()) % buckets for w in words]


def hashed_batch(texts: list[str], buckets: int, max_words: int) -> torch.Tensor:
    """[B, max_words] long ids of `hash_words`, right-padded with 0."""
    ids = torch.zeros(len(texts), max_words, dtype=torch.long)
    for i, text in enumerate(texts):
        row = hash_words(text, buckets, max_words)
        ids[i, : len(row)] = torch.tensor(row)
    return ids
