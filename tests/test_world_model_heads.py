"""The outcome heads read the frame, the instruction and the joint state."""

import pytest
import torch

from worldloop.common.text import hash_words, hashed_batch
from worldloop.world_model.heads import OutcomeHeads, OutcomeHeadsConfig


def test_hashed_words_are_stable_and_padded():
    assert hash_words("Reach the RED cube", 1024, 16) == hash_words("reach the red cube!", 1024, 16)
    ids = hashed_batch(["reach red", "reach the blue cube now"], 1024, 3)
    assert ids.shape == (2, 3)
    assert ids[0, 2] == 0 and (ids[1] > 0).all()


def _fit(heads, frames, tasks, state, labels, steps=150):
    opt = torch.optim.Adam(heads.parameters(), 1e-2)
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            heads(frames, tasks, state)["success_logit"], labels
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.sigmoid(heads.eval()(frames, tasks, state)["success_logit"])


def test_heads_learn_a_task_dependent_success():
    torch.manual_seed(0)
    heads = OutcomeHeads(OutcomeHeadsConfig(channels=16, use_state=False))
    frames = torch.rand(1, 1, 3, 16, 16).expand(8, 1, 3, 16, 16) * 2 - 1  # the same frame for every sample
    tasks = ["reach the red cube", "reach the blue cube"] * 4
    labels = torch.tensor([1.0, 0.0] * 4)  # success only under the first instruction
    p = _fit(heads, frames, tasks, None, labels)
    assert (p[::2] > 0.9).all() and (p[1::2] < 0.1).all()


def test_heads_learn_where_the_object_is():
    # Success when a bright square sits in the left half of the frame: position, not content, decides.
    torch.manual_seed(0)
    frames = -torch.ones(16, 1, 3, 16, 16)
    labels = torch.zeros(16)
    for i in range(16):
        x = int(torch.randint(0, 14, ()))
        y = int(torch.randint(0, 14, ()))
        frames[i, 0, :, y : y + 3, x : x + 3] = 1
        labels[i] = float(x + 1 < 8)
    heads = OutcomeHeads(OutcomeHeadsConfig(channels=16, use_state=False, dropout=0.0, augment_shift=0))
    p = _fit(heads, frames, None, None, labels, steps=200)
    assert ((p > 0.5).float() == labels).all()


def test_heads_with_state_learn_a_state_dependent_success():
    # The same frame and instruction; only the joint state says whether the arm is at the goal.
    torch.manual_seed(0)
    heads = OutcomeHeads(OutcomeHeadsConfig(channels=16, dropout=0.0), state_dim=4)
    frames = torch.rand(1, 1, 3, 16, 16).expand(8, 1, 3, 16, 16)
    state = torch.randn(8, 4)
    labels = (state[:, 0] > 0).float()
    p = _fit(heads, frames, ["reach the red cube"] * 8, state, labels)
    assert ((p > 0.5).float() == labels).all()


def test_heads_shapes_and_errors():
    heads = OutcomeHeads(OutcomeHeadsConfig(channels=8), num_views=2, state_dim=3)
    out = heads(torch.randn(3, 5, 2, 3, 16, 16), ["a", "b", "c"], torch.randn(3, 5, 3))  # 5 frames, 2 views
    assert out["success_logit"].shape == (3, 5)
    assert heads(torch.randn(3, 2, 3, 16, 16), None, torch.randn(3, 3))["reward"].shape == (3,)
    with pytest.raises(ValueError, match="2 instructions for a batch of 3"):
        heads(torch.randn(3, 2, 3, 16, 16), ["a", "b"], torch.randn(3, 3))
    with pytest.raises(ValueError, match="use_state"):
        heads(torch.randn(3, 2, 3, 16, 16), None)
    with pytest.raises(ValueError, match=r"\[B, \.\.\., 2, 3, H, W\]"):
        heads(torch.randn(3, 1, 3, 16, 16), None, torch.randn(3, 3))
    with pytest.raises(ValueError, match="state size"):
        OutcomeHeads(OutcomeHeadsConfig(use_state=True))


def test_training_shifts_the_frames_and_evaluation_does_not():
    torch.manual_seed(0)
    heads = OutcomeHeads(OutcomeHeadsConfig(channels=8, use_state=False, dropout=0.0, augment_shift=3))
    frames = torch.rand(4, 1, 3, 16, 16) * 2 - 1
    heads.train()
    trained = [heads(frames)["success_logit"] for _ in range(6)]
    assert any(not torch.allclose(trained[0], t) for t in trained[1:])
    heads.eval()
    torch.testing.assert_close(heads(frames)["success_logit"], heads(frames)["success_logit"])


def test_heads_judge_from_the_first_frame_and_the_state_alone():
    # Success when the "fingertip" (state[:, 0], in [-1, 1] across the image) is at the column of the
    # square in the episode's first frame. The judged frame is noise that says nothing, and with
    # use_frame=False the heads do not read it at all.
    torch.manual_seed(0)
    n = 32
    first = -torch.ones(n, 1, 3, 16, 16)
    state = torch.zeros(n, 4)
    labels = torch.zeros(n)
    for i in range(n):
        x = int(torch.randint(0, 14, ()))
        first[i, 0, :, 6:9, x : x + 3] = 1
        hit = i % 2 == 0
        column = x + 1 if hit else (x + 8) % 16
        state[i, 0] = column / 7.5 - 1
        labels[i] = float(hit)
    cfg = OutcomeHeadsConfig(channels=16, dropout=0.0, augment_shift=0, use_first_frame=True, use_frame=False)
    heads = OutcomeHeads(cfg, state_dim=4)
    opt = torch.optim.Adam(heads.parameters(), 1e-2)
    frames = torch.rand(n, 1, 3, 16, 16) * 2 - 1
    for _ in range(300):
        logit = heads(frames, None, state, first)["success_logit"]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    heads.eval()
    judged = heads(frames, None, state, first)["success_logit"]
    assert ((judged > 0).float() == labels).all()
    other_frames = torch.rand(n, 1, 3, 16, 16) * 2 - 1
    torch.testing.assert_close(heads(other_frames, None, state, first)["success_logit"], judged)
    moved = heads(frames, None, state, first.roll(8, -1))["success_logit"]
    assert ((moved > 0).float() != labels).any()


def test_first_frame_is_one_per_episode_and_required():
    cfg = OutcomeHeadsConfig(channels=8, use_first_frame=True)
    heads = OutcomeHeads(cfg, num_views=2, state_dim=3).eval()
    frames, state, first = torch.randn(3, 5, 2, 3, 16, 16), torch.randn(3, 5, 3), torch.randn(3, 2, 3, 16, 16)
    out = heads(frames, None, state, first)["success_logit"]
    assert out.shape == (3, 5)
    # Every frame of an episode is judged against that episode's first frame.
    swapped = heads(frames, None, state, first[[1, 0, 2]])["success_logit"]
    assert not torch.allclose(swapped[:2], out[:2]) and torch.allclose(swapped[2], out[2])
    with pytest.raises(ValueError, match="use_first_frame"):
        heads(frames, None, state)
    with pytest.raises(ValueError, match=r"expected \[3, 2, 3, 16, 16\]"):
        heads(frames, None, state, first[:, :1])
    with pytest.raises(ValueError, match="use_frame=False needs heads.use_first_frame"):
        OutcomeHeads(OutcomeHeadsConfig(use_frame=False, use_state=False))
