"""Policy inference beside the control loop.

`PolicyRunner` turns a robot observation into a policy batch and the answer into a numpy chunk; camera
frames are resized to the policy's training size on the way (a 640x480 camera drives a 64x64 policy).
`ThreadedInference` runs it in a worker thread (the real-time path); `SimulatedLatencyInference` computes
at once but delivers after a sampled latency on the control clock (lock-step simulation and benchmarks,
where wall time does not matter but the delay must).
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from worldloop.data.features import STATE, TASK, image_key
from worldloop.data.images import RESIZE_MODES, resize_frames
from worldloop.vla.policy import Policy

logger = logging.getLogger(__name__)


@dataclass
class InferenceRequest:
    observation: dict  # the robot's observation: "<joint>.pos" floats and HxWx3 uint8 camera images
    obs_time: float  # control-clock seconds of the observation
    prefix: np.ndarray | None = None  # [P, D] plan at the new chunk's action times (real-time chunking)
    inference_delay: int = 0  # policy steps expected to pass before the chunk arrives


@dataclass
class InferenceResult:
    actions: np.ndarray  # [H, D]
    obs_time: float
    compute_s: float  # wall time spent in the policy


def prefix_method(policy) -> Callable | None:
    """How `policy` inpaints a chunk after a given prefix (real-time chunking), or None if it cannot.

    The agreed interface is `predict_action_chunk(batch, prefix_actions=..., inference_delay=...)`;
    FlowVLA also exposes it as `predict_action_chunk_with_prefix(batch, prefix, inference_delay)`.
    """
    params = inspect.signature(policy.predict_action_chunk).parameters
    if "prefix_actions" in params and "inference_delay" in params:
        return lambda batch, prefix, delay: policy.predict_action_chunk(
            batch, prefix_actions=prefix, inference_delay=delay
        )
    method = getattr(policy, "predict_action_chunk_with_prefix", None)
    if callable(method):
        return lambda batch, prefix, delay: method(batch, prefix, delay)
    return None


def policy_image_size(policy) -> tuple[int, int] | None:
    """The [H, W] a policy was trained at (`config.image_size`), or None when it does not declare one."""
    size = tuple(getattr(getattr(policy, "config", None), "image_size", ()) or ())
    if len(size) != 2 or not all(size):
        return None
    return int(size[0]), int(size[1])


class PolicyRunner:
    """`resize`: how a camera frame of another size than the policy's reaches it, as the training data's
    `dataset.resize`: "crop" (centre-crop to the policy's aspect ratio, then resize), "stretch", or ""
    (frames must already have the policy's size)."""

    def __init__(
        self,
        policy: Policy,
        joint_names: tuple[str, ...],
        instruction: str,
        use_prefix: bool,
        resize: str = "crop",
    ):
        if resize not in RESIZE_MODES:
            raise ValueError(f"PolicyRunner resize={resize!r}; expected one of {RESIZE_MODES}")
        self.policy = policy
        self.joint_names = joint_names
        self.instruction = instruction
        self.image_size = policy_image_size(policy)
        self.resize = resize
        self._with_prefix = prefix_method(policy) if use_prefix else None
        if use_prefix and self._with_prefix is None:
            logger.warning(
                "fuser 'rtc' needs a policy with prefix inpainting (predict_action_chunk(batch, "
                "prefix_actions=..., inference_delay=...)); %s has none: chunks are aligned as with 'naive'",
                type(policy).__name__,
            )

    @property
    def uses_prefix(self) -> bool:
        return self._with_prefix is not None

    def batch(self, observation: dict) -> dict:
        missing = [f"{j}.pos" for j in self.joint_names if f"{j}.pos" not in observation]
        if missing:
            raise KeyError(f"robot observation lacks joint positions {missing}; has {sorted(observation)}")
        state = torch.tensor(
            [[float(observation[f"{j}.pos"]) for j in self.joint_names]], dtype=torch.float32
        )
        batch: dict = {STATE: state, TASK: [self.instruction]}
        for key, value in observation.items():
            if isinstance(value, np.ndarray) and value.ndim == 3:
                image = torch.from_numpy(np.ascontiguousarray(value)).permute(2, 0, 1)
                batch[image_key(key)] = self._to_policy_size(key, image).float().unsqueeze(0) / 255.0
        return batch

    def _to_policy_size(self, camera: str, image: torch.Tensor) -> torch.Tensor:
        """uint8 [3, H, W] at the policy's size, resized as the training frames were (data/images.py)."""
        if image.dtype != torch.uint8 or image.shape[0] != 3:
            raise ValueError(
                f"camera {camera!r}: expected a uint8 HxWx3 image, got {image.dtype} of shape "
                f"{tuple(image.permute(1, 2, 0).shape)}"
            )
        if self.image_size is None or tuple(image.shape[-2:]) == self.image_size:
            return image
        if not self.resize:
            raise ValueError(
                f"camera {camera!r} gives {image.shape[-2]}x{image.shape[-1]} frames but the policy expects "
                f"{self.image_size[0]}x{self.image_size[1]} and resizing is off (resize='crop' or 'stretch')"
            )
        return resize_frames(image, self.image_size, self.resize)

    @torch.no_grad()
    def __call__(self, request: InferenceRequest) -> np.ndarray:
        batch = self.batch(request.observation)
        if self._with_prefix is not None and request.prefix is not None and len(request.prefix) > 0:
            prefix = torch.as_tensor(request.prefix, dtype=torch.float32).unsqueeze(0)
            delay = min(request.inference_delay, len(request.prefix))
            chunk = self._with_prefix(batch, prefix, delay)
        else:
            chunk = self.policy.predict_action_chunk(batch)
        actions = chunk[0].detach().cpu().double().numpy()
        if actions.ndim != 2 or actions.shape[1] != len(self.joint_names):
            raise ValueError(
                f"{type(self.policy).__name__}.predict_action_chunk returned {tuple(chunk.shape)}; expected "
                f"[1, H, {len(self.joint_names)}] joint targets"
            )
        return actions


class ThreadedInference:
    """One request at a time in a worker thread; the control loop polls without ever blocking."""

    def __init__(self, runner: Callable[[InferenceRequest], np.ndarray]):
        self.runner = runner
        self._requests: queue.Queue = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._result: InferenceResult | None = None
        self._error: BaseException | None = None
        self._busy = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._work, name="policy-inference", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._busy

    def submit(self, request: InferenceRequest, now: float) -> None:
        if self._busy:
            raise RuntimeError("ThreadedInference.submit: a request is already in flight")
        self._busy = True
        self._requests.put_nowait(request)

    def poll(self, now: float) -> InferenceResult | None:
        """The finished chunk, if any (re-raises an error from the worker in the control thread)."""
        with self._lock:
            if self._error is not None:
                raise RuntimeError("policy inference failed") from self._error
            result, self._result = self._result, None
        if result is not None:
            self._busy = False
        return result

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                request = self._requests.get(timeout=0.1)
            except queue.Empty:
                continue
            start = time.perf_counter()
            try:
                actions = self.runner(request)
            except BaseException as e:  # handed to the control thread, which stops safely
                with self._lock:
                    self._error = e
                return
            with self._lock:
                self._result = InferenceResult(actions, request.obs_time, time.perf_counter() - start)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)  # a hung policy must not hang the shutdown (daemon thread)


class SimulatedLatencyInference:
    """Computes at once, delivers `latency()` seconds later on the control clock (no wall-clock wait)."""

    def __init__(self, runner: Callable[[InferenceRequest], np.ndarray], latency: Callable[[], float]):
        self.runner = runner
        self.latency = latency
        self._pending: tuple[float, InferenceResult] | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None

    def submit(self, request: InferenceRequest, now: float) -> None:
        if self._pending is not None:
            raise RuntimeError("SimulatedLatencyInference.submit: a request is already in flight")
        start = time.perf_counter()
        actions = self.runner(request)
        result = InferenceResult(actions, request.obs_time, time.perf_counter() - start)
        self._pending = (now + max(0.0, self.latency()), result)

    def poll(self, now: float) -> InferenceResult | None:
        if self._pending is None or now + 1e-9 < self._pending[0]:
            return None
        result, self._pending = self._pending[1], None
        return result

    def close(self) -> None:
        self._pending = None
