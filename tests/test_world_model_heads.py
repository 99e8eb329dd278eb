"""The outcome heads read the instruction: success can differ between tasks on the same frame."""

import pytest
import torch

from common.text import hash_words, hashed_batch
from world_model.heads import OutcomeHeads, OutcomeHeadsConfig


def test_hashed_words_are_stable_and_padded():
    assert hash_words("Reach the RED cube", 1024, 16) == hash_words("reach the red cube!", 1024, 16)
    ids = hashed_batch(["reach red", "reach the blue cube now"], 1024, 3)
    assert ids.shape == (2, 3)
    assert ids[0, 2] == 0 and (ids[1] > 0).all()


def test_heads_learn_a_task_dependent_success():
    torch.manual_seed(0)
    heads = OutcomeHeads(width=16, cfg=OutcomeHeadsConfig(hidden=32))
    features = torch.randn(1, 5, 16).expand(8, 5, 16)  # the same frame (5 tokens) for every sample
    tasks = ["reach the red cube", "reach the blue cube"] * 4
    labels = torch.tensor([1.0, 0.0] * 4)  # success only under the first instruction
    opt = torch.optim.Adam(heads.parameters(), 1e-2)
    for _ in range(100):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            heads(features, tasks)["success_logit"], labels
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = torch.sigmoid(heads(features[:2], tasks[:2])["success_logit"])
    assert p[0] > 0.9 and p[1] < 0.1


def test_heads_shapes_and_errors():
    heads = OutcomeHeads(width=16)
    out = heads(torch.randn(3, 5, 7, 16), ["a", "b", "c"])  # 5 frames of 7 tokens
    assert out["success_logit"].shape == (3, 5)
    assert heads(torch.randn(3, 7, 16))["reward"].shape == (3,)  # no task: the zero embedding
    with pytest.raises(ValueError, match="2 instructions for a batch of 3"):
        heads(torch.randn(3, 7, 16), ["a", "b"])


def test_heads_with_state_learn_a_state_dependent_success():
    # The same frame and instruction; only the joint state says whether the arm is at the goal.
    torch.manual_seed(0)
    heads = OutcomeHeads(width=16, cfg=OutcomeHeadsConfig(hidden=32, use_state=True), state_dim=4)
    features = torch.randn(1, 5, 16).expand(8, 5, 16)
    state = torch.randn(8, 4)
    labels = (state[:, 0] > 0).float()
    opt = torch.optim.Adam(heads.parameters(), 1e-2)
    for _ in range(150):
        logits = heads(features, ["reach the red cube"] * 8, state)["success_logit"]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    p = torch.sigmoid(heads(features, ["reach the red cube"] * 8, state)["success_logit"])
    assert ((p > 0.5).float() == labels).all()
    with pytest.raises(ValueError, match="use_state"):
        heads(features, None)
    with pytest.raises(ValueError, match="state size"):
        OutcomeHeads(width=16, cfg=OutcomeHeadsConfig(use_state=True))
