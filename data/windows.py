"""Torch datasets over an `EpisodeDataset`: world-model windows and policy samples.

Both read either from the in-memory `FrameTable` (`cache=True`, the default: every frame decoded once;
see benchmarks/data_loading.py for why) or through lerobot's own `__getitem__` with `delta_timestamps`
(`cache=False`: nothing held in memory, for datasets too large to cache). The two paths return the same
values; tests/test_data_windows.py checks that.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, Subset, default_collate

from worldloop.data.dataset import DatasetError, EpisodeDataset
from worldloop.data.features import ACTION, DONE, ENVIRONMENT_STATE, REWARD, STATE, SUCCESS, TASK, image_key


def _to_uint8(images: torch.Tensor) -> torch.Tensor:
    return (images * 255).round().to(torch.uint8)


class WorldModelWindows(Dataset):
    """Windows of `context + horizon` consecutive frames inside one episode.

    Item: `frames` [T, V, 3, H, W] (uint8, or float in [0, 1] with `float_frames`), `actions` [T, A] (the
    action taken at each frame: frame t+1 follows from frame t and action t), `state` [T, S],
    `reward` / `success` / `done` [T], `task` (str), `episode_index`, `frame_index` (of the first frame),
    `first_frame` [V, 3, H, W] (the episode's first frame, as `frames`: the real frame imagination starts
    an episode from, which outcome heads with `use_first_frame` read), and `environment_state` [T, E] where
    the dataset records `observation.environment_state`.

    Windows never cross an episode boundary. Episodes shorter than the window give no window (they are
    listed in `skipped_episodes`); padding them would teach the model frames that never happened.
    """

    def __init__(
        self,
        dataset: EpisodeDataset,
        episodes: list[int] | None = None,
        context: int = 4,
        horizon: int = 1,
        stride: int = 1,
        float_frames: bool = False,
        cache: bool = True,
    ):
        if context < 1 or horizon < 0 or stride < 1:
            raise ValueError(
                f"need context >= 1, horizon >= 0, stride >= 1; got {context}, {horizon}, {stride}"
            )
        self.dataset = dataset
        self.length = context + horizon
        self.float_frames = float_frames
        self.cache = cache
        selected = dataset.select_episodes(episodes)
        self.skipped_episodes = [ep.index for ep in selected if ep.length < self.length]
        # (episode index, absolute index of the window's first frame)
        self.starts = [
            (ep.index, s) for ep in selected for s in range(ep.start, ep.end - self.length + 1, stride)
        ]
        if not self.starts:
            raise DatasetError(
                f"dataset {dataset.root}: no episode among {len(selected)} has the {self.length} frames a "
                f"window needs (context {context} + horizon {horizon})"
            )
        if cache:
            self.table = dataset.frame_table()
        else:
            keys = [image_key(c) for c in dataset.cameras]
            keys += [STATE, ACTION, *dataset.reward_keys, *dataset.object_keys]
            offsets = [t / dataset.fps for t in range(self.length)]
            self.lerobot = dataset.lerobot_with_deltas({k: offsets for k in keys})

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        episode, start = self.starts[i]
        item = self._from_table(episode, start) if self.cache else self._from_lerobot(episode, start)
        if self.float_frames:
            item["frames"] = item["frames"].float() / 255
            item["first_frame"] = item["first_frame"].float() / 255
        item["episode_index"] = episode
        return item

    def _table_frames(self, episode: int, start: int) -> torch.Tensor:
        """[T, V, 3, H, W] uint8 frames of the window at `start` (a subclass may draw them instead)."""
        window = slice(start, start + self.length)
        return torch.stack([self.table.images[c][window] for c in self.dataset.cameras], dim=1)

    def _from_table(self, episode: int, start: int) -> dict:
        t, window = self.table, slice(start, start + self.length)
        first = self.dataset.episodes[episode].start
        objects = {} if t.environment_state is None else {"environment_state": t.environment_state[window]}
        return {
            **objects,
            "frames": self._table_frames(episode, start),
            "first_frame": torch.stack([t.images[c][first] for c in self.dataset.cameras]),
            "actions": t.action[window],
            "state": t.state[window],
            "reward": t.reward[window],
            "success": t.success[window],
            "done": t.done[window],
            "task": t.task[start],
            "frame_index": int(t.frame_index[start]),
        }

    def _from_lerobot(self, episode: int, start: int) -> dict:
        item = self.lerobot[start]
        n = self.length
        last = self.dataset.episodes[episode].end - 1
        # Same fill rule as FrameTable for datasets without reward features.
        filled = {
            REWARD: torch.zeros(n),
            SUCCESS: torch.zeros(n, dtype=torch.bool),
            DONE: torch.arange(start, start + n) == last,
        }
        frames = torch.stack([self.dataset.resize(item[image_key(c)]) for c in self.dataset.cameras], dim=1)
        # The episode's first frame: a second read (of a window), unless this window starts there.
        first_start = self.dataset.episodes[episode].start
        first_item = item if first_start == start else self.lerobot[first_start]
        first = torch.stack([self.dataset.resize(first_item[image_key(c)][0]) for c in self.dataset.cameras])
        objects = {"environment_state": item[ENVIRONMENT_STATE]} if ENVIRONMENT_STATE in item else {}
        return {
            **objects,
            "frames": _to_uint8(frames),
            "first_frame": _to_uint8(first),
            "actions": item[ACTION],
            "state": item[STATE],
            **{k.removeprefix("next."): item[k].reshape(n) if k in item else v for k, v in filled.items()},
            "task": item[TASK],
            "frame_index": int(item["frame_index"]),
        }


def object_motion(windows: WorldModelWindows) -> torch.Tensor:
    """[len(windows)] float: how far the objects move inside each window, the largest range (max - min over
    the window's frames) of any `observation.environment_state` value, in that feature's own units. A
    DatasetError naming the dataset when it records no environment state."""
    table = windows.dataset.frame_table()
    if table.environment_state is None:
        raise DatasetError(
            f"dataset {windows.dataset.root} records no {ENVIRONMENT_STATE}: the objects' motion is unknown "
            "(sim recordings write it with record_demos.py --environment_state=true)"
        )
    rows = torch.tensor([start for _, start in windows.starts])
    spans = table.environment_state[rows[:, None] + torch.arange(windows.length)]  # [W, T, E]
    return (spans.amax(dim=1) - spans.amin(dim=1)).amax(dim=1)


def repeat_moving_windows(windows: WorldModelWindows, repeat: int, min_motion: float) -> Dataset:
    """`windows` with every window whose objects move by more than `min_motion` (`object_motion`) listed
    `repeat` times: an epoch then holds `repeat` times as many of the windows where something is pushed.
    Where objects move in a minority of frames, the loss of drawing them moving is a small share of the
    whole; repeating those windows raises it without weighting pixels (which lost the still objects)."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    moving = object_motion(windows) > min_motion
    index = torch.arange(len(windows))
    return Subset(windows, torch.cat([index, index[moving].repeat(repeat - 1)]).tolist())


class CounterfactualPairs(Dataset):
    """Pairs of `windows` (a `WorldModelWindows`) at the same frame offset of two episodes that start from the
    same start: counterfactual takes of one start, whose futures differ only by their actions (recorded with
    record_demos.py --variants). Item: (window, its partner), each a `WorldModelWindows` item; `pair_collate`
    batches them as every pair's first window, then every pair's second (the order the world model's
    `counterfactual_weight` reads). Two episodes share a start when their first frames (every camera) and first
    states are equal bit for bit; a start taken k times gives k(k-1)/2 pairs at each offset. A DatasetError
    naming the dataset when no two of the windows' episodes share a start."""

    def __init__(self, windows: WorldModelWindows):
        self.windows = windows
        dataset, table = windows.dataset, windows.dataset.frame_table()
        offsets: dict[int, dict[int, int]] = {}  # episode -> offset of a window's first frame -> its index
        for i, (episode, start) in enumerate(windows.starts):
            offsets.setdefault(episode, {})[start - dataset.episodes[episode].start] = i
        takes: dict[bytes, list[int]] = {}  # a start (its first frames and state) -> its episodes
        for episode in offsets:
            first = dataset.episodes[episode].start
            key = b"".join(table.images[c][first].numpy().tobytes() for c in dataset.cameras)
            takes.setdefault(key + table.state[first].numpy().tobytes(), []).append(episode)
        self.pairs = [
            (i, offsets[other][offset])
            for group in takes.values()
            for n, episode in enumerate(group)
            for other in group[n + 1 :]
            for offset, i in offsets[episode].items()
            if offset in offsets[other]
        ]
        self.starts = sum(len(group) > 1 for group in takes.values())  # starts with a pair of takes
        if not self.pairs:
            raise DatasetError(
                f"dataset {dataset.root}: no two of its {len(offsets)} training episodes start from the same start, "
                "so there are no counterfactual pairs; record each start several ways with "
                "record_demos.py --variants=2"
            )

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[dict, dict]:
        a, b = self.pairs[i]
        return self.windows[a], self.windows[b]


def pair_collate(items: list[tuple[dict, dict]]) -> dict:
    """A batch of `CounterfactualPairs` items: the first windows of the pairs, then their partners."""
    return default_collate([a for a, _ in items] + [b for _, b in items])


class PolicySamples(Dataset):
    """One sample per frame, in LeRobot's policy-batch layout.

    Item: `observation.images.<cam>` float [3, H, W] in [0, 1], `observation.state` [S], `task` (str),
    `action` [chunk_size, A] (the actions from this frame on), `action_is_pad` [chunk_size] (True past the
    episode's end, where the last action is repeated, as LeRobot does), `episode_index`, `frame_index`.
    """

    def __init__(
        self,
        dataset: EpisodeDataset,
        episodes: list[int] | None = None,
        chunk_size: int = 8,
        cache: bool = True,
    ):
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.dataset = dataset
        self.chunk_size = chunk_size
        self.cache = cache
        selected = dataset.select_episodes(episodes)
        self.frames = [(ep.index, i) for ep in selected for i in range(ep.start, ep.end)]
        if not self.frames:
            raise DatasetError(f"dataset {dataset.root}: the selected episodes have no frames")
        if cache:
            self.table = dataset.frame_table()
        else:
            self.lerobot = dataset.lerobot_with_deltas({ACTION: [t / dataset.fps for t in range(chunk_size)]})

    def __len__(self) -> int:
        return len(self.frames)

    def __getitem__(self, i: int) -> dict:
        episode, index = self.frames[i]
        item = {"episode_index": episode}
        if self.cache:
            t = self.table
            chunk = torch.arange(index, index + self.chunk_size)
            end = self.dataset.episodes[episode].end
            for c in self.dataset.cameras:
                item[image_key(c)] = t.images[c][index].float() / 255
            item[STATE] = t.state[index]
            item[ACTION] = t.action[chunk.clamp(max=end - 1)]
            item["action_is_pad"] = chunk >= end
            item[TASK] = t.task[index]
            item["frame_index"] = int(t.frame_index[index])
        else:
            raw = self.lerobot[index]
            for c in self.dataset.cameras:
                item[image_key(c)] = self.dataset.resize(raw[image_key(c)])
            for key in [STATE, ACTION, "action_is_pad", TASK]:
                item[key] = raw[key]
            item["frame_index"] = int(raw["frame_index"])
        return item
