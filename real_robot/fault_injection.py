"""Test doubles and fault generators for the runtime: used by the tests and by benchmarks/runtime_faults.py.

Nothing in the runtime imports this module. It plays the robot, the policy, a bad client or the operator
for the runtime, so that tests and benchmarks inject the same faults:

- robots with LeRobot's `Robot` shape: `FakeRobot` follows every command exactly (and can fail or be
  interrupted at a given send); `BlockedJointRobot` lets one joint stop following for a while, then jump
  free. Policies with the `Policy` interface: `SlowSmoothPolicy` (a slow smooth chunk around the state, can
  hang) and `GoalPolicy` (always the same goal). `run_blocked`: a lock-step run with a blocked joint.
- the policy server's wire: `start_policy_server` (short timeouts, a `MESSAGE_LIMIT` cap),
  `malformed_message` (one random bad message, 18 kinds), `send_raw` (one client sends it),
  `answers_a_good_client`, and the message builders (`npz`, `meta_array`, `infer_message`, `framed`).
- a deploy run in its own process, for signals and `kill -9` from outside (`start_child` starts it,
  `read_sends` reads what it sent):

      python -m worldloop.real_robot.fault_injection OUT_DIR [--robot fake|sim] [--record] [--segment_s S]
          [--stop_hold_s S] [--episode_time_s S]

  Every command sent to the robot is appended to OUT_DIR/sent.log ("send p1 p2 ..."), with "connect" and
  "disconnect" lines; with --record, the joint state of every observation handed to the recorder is
  appended to OUT_DIR/observed.log before the recorder sees it, and the dataset goes to OUT_DIR/run. Each
  line is flushed at once, so the logs survive a `kill -9`. Exits 130 after an interrupt (SIGINT, SIGTERM).
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.data.recording import RECORDING_META
from worldloop.real_robot.fusion import FuserConfig, make_fuser
from worldloop.real_robot.inference import InferenceRequest, PolicyRunner, SimulatedLatencyInference
from worldloop.real_robot.policy_server import PolicyServer, RemotePolicyClient, encode_message
from worldloop.real_robot.runtime import ControlRuntime, RobotIO, RuntimeConfig, run_lockstep
from worldloop.real_robot.safety import SafetyConfig, SafetyLimiter, SafetyStop, TrackingGuard
from worldloop.vla.policy import Policy

SPEC = TABLETOP_ARM
JOINT_KEYS = [f"{j}.pos" for j in SPEC.joint_names]
MESSAGE_LIMIT = 1 << 20  # the policy server's cap under fault injection: 1 MiB


# ---- robots and policies -------------------------------------------------------------------------------
class FakeRobot:
    """Follows every command exactly; returns small camera images; records what it was sent."""

    name = "fake"

    def __init__(
        self,
        start=None,
        image_size=(8, 8),
        joint_names=TABLETOP_ARM.joint_names,
        fail_after=None,
        interrupt_at=None,
    ):
        self.joint_names = joint_names
        self.position = np.zeros(len(joint_names)) if start is None else np.asarray(start, dtype=float)
        self.image_size = image_size
        self.sent: list[np.ndarray] = []
        self.connected = False
        self.fail_after = fail_after  # raise on this many-th send_action (an error mid-run)
        self.interrupt_at = interrupt_at  # raise KeyboardInterrupt once, as Ctrl-C would, at this send
        self.task = "reach the red cube"

    @property
    def observation_features(self) -> dict:
        return {**{f"{j}.pos": float for j in self.joint_names}, "front": (*self.image_size, 3)}

    @property
    def action_features(self) -> dict:
        return {f"{j}.pos": float for j in self.joint_names}

    @property
    def is_connected(self) -> bool:
        return self.connected

    def connect(self, calibrate: bool = True) -> None:
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False

    def get_observation(self) -> dict:
        assert self.connected, "get_observation on a disconnected robot"
        obs = {f"{j}.pos": float(p) for j, p in zip(self.joint_names, self.position)}
        obs["front"] = np.full((*self.image_size, 3), len(self.sent) % 256, dtype=np.uint8)
        return obs

    def send_action(self, action: dict) -> dict:
        assert self.connected, "send_action on a disconnected robot"
        if self.fail_after is not None and len(self.sent) >= self.fail_after:
            raise OSError("fake robot: serial bus error")
        if self.interrupt_at is not None and len(self.sent) == self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        self.position = np.array([action[f"{j}.pos"] for j in self.joint_names])
        self.sent.append(self.position.copy())
        return action

    def task_success(self) -> bool:
        return False


class BlockedJointRobot(FakeRobot):
    """Joint `joint` stops following between sends `blocked_from` and `freed_at`; once freed it goes
    straight to the command, at whatever speed that takes (as a servo released from a jam does)."""

    def __init__(self, joint: int, blocked_from: int, freed_at: int):
        super().__init__(start=np.zeros(SPEC.num_joints))
        self.joint, self.blocked_from, self.freed_at = joint, blocked_from, freed_at
        self.measured: list[np.ndarray] = []

    def send_action(self, action: dict) -> dict:
        held = self.position[self.joint]
        super().send_action(action)
        if self.blocked_from <= len(self.sent) < self.freed_at:
            self.position[self.joint] = held
        self.measured.append(self.position.copy())
        return action


class SlowSmoothPolicy(Policy):
    """Sleeps `latency_s`, then returns a slow sine around the current state (a smooth chunk)."""

    def __init__(
        self, latency_s: float = 0.15, chunk_size: int = 10, amplitude: float = 0.3, hang_after=None
    ):
        super().__init__()
        self.latency_s, self.chunk_size, self.n_action_steps = latency_s, chunk_size, chunk_size // 2
        self.action_dim = TABLETOP_ARM.num_joints
        self.amplitude = amplitude
        self.hang_after = hang_after  # stop answering after this many chunks (watchdog tests)
        self.calls = 0
        self.unblock = threading.Event()  # set it to let a hung policy return

    def reset(self) -> None:
        self.calls = 0

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        self.calls += 1
        if self.hang_after is not None and self.calls > self.hang_after:
            self.unblock.wait(60)
        time.sleep(self.latency_s)
        state = batch["observation.state"][0].double()
        t = torch.arange(1, self.chunk_size + 1, dtype=torch.float64) / TABLETOP_ARM.fps
        phase = torch.tensor(float(self.calls))
        offsets = self.amplitude * 0.1 * torch.sin(2 * t + phase)[:, None] * torch.ones(self.action_dim)
        return (state + offsets).unsqueeze(0).float()

    def select_action(self, batch: dict) -> torch.Tensor:
        return self.predict_action_chunk(batch)[:, 0]

    def save_pretrained(self, path) -> None:
        raise NotImplementedError("a test double has no weights")

    @classmethod
    def from_pretrained(cls, path):
        raise NotImplementedError("a test double has no weights")


class GoalPolicy(Policy):
    """Every chunk says: go to `goal` (it never notices that the arm does not follow)."""

    def __init__(self, goal):
        super().__init__()
        self.goal, self.chunk_size, self.n_action_steps = torch.tensor(goal, dtype=torch.float32), 10, 5

    def reset(self) -> None:
        pass

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        return self.goal.expand(1, self.chunk_size, -1).clone()

    def select_action(self, batch: dict) -> torch.Tensor:
        return self.goal[None]

    def save_pretrained(self, path) -> None:
        raise NotImplementedError("a test double has no weights")

    @classmethod
    def from_pretrained(cls, path):
        raise NotImplementedError("a test double has no weights")


def run_blocked(
    tracking_margin, joint=1, blocked_from=20, freed_at=150, goal=(0.0, 1.2, 0.0, 0.0)
) -> tuple[BlockedJointRobot, ControlRuntime, Exception | None]:
    """A lock-step run towards `goal` in which `joint` is blocked between two sends, with the tracking guard
    (`tracking_ticks` 20) where `tracking_margin` is set; returns the robot, the runtime and the SafetyStop
    it ended with (None if it ran its 3 s)."""
    robot = BlockedJointRobot(joint=joint, blocked_from=blocked_from, freed_at=freed_at)
    robot.connect()
    cfg = RuntimeConfig(stop_hold_s=0.2)
    dt = 1.0 / cfg.control_hz
    safety_cfg = SafetyConfig(tracking_margin=tracking_margin, tracking_ticks=20)
    fuser = make_fuser(FuserConfig(name="naive"), SPEC, dt)
    runner = PolicyRunner(GoalPolicy(list(goal)), SPEC.joint_names, "reach", use_prefix=False)
    runtime = ControlRuntime(
        RobotIO(robot, SPEC.joint_names),
        SimulatedLatencyInference(runner, lambda: 0.05),
        fuser,
        SafetyLimiter(SPEC, dt, safety_cfg),
        SPEC,
        cfg,
        policy_chunk_size=10,
        tracking=TrackingGuard(SPEC, safety_cfg) if tracking_margin else None,
    )
    try:
        run_lockstep(runtime, 3.0)
    except SafetyStop as e:
        return robot, runtime, e
    return robot, runtime, None


# ---- the policy server's wire --------------------------------------------------------------------------
def start_policy_server() -> tuple[PolicyServer, threading.Thread]:
    """A local policy server serving `SlowSmoothPolicy` without latency on a daemon thread: 0.5 s idle and
    read timeouts, messages capped at `MESSAGE_LIMIT`. Close the server to stop the thread."""
    server = PolicyServer(
        SlowSmoothPolicy(latency_s=0.0),
        SPEC.joint_names,
        port=0,
        idle_timeout_s=0.5,
        read_timeout_s=0.5,
        max_message_bytes=MESSAGE_LIMIT,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def server_address(server: PolicyServer) -> str:
    return f"{server.address[0]}:{server.address[1]}"


def good_request() -> InferenceRequest:
    obs = {k: 0.1 for k in JOINT_KEYS} | {"front": np.zeros((8, 8, 3), np.uint8)}
    return InferenceRequest(obs, 0.0)


def answers_a_good_client(server: PolicyServer) -> bool:
    """Whether a fresh client gets a full chunk from `server`."""
    client = RemotePolicyClient(server_address(server), "push", timeout_s=5.0)
    try:
        return client(good_request()).shape == (10, SPEC.num_joints)
    finally:
        client.close()


def npz(arrays: dict, compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def meta_array(meta) -> np.ndarray:
    """`meta` as the JSON header array of a message."""
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


def infer_message(**changes) -> bytes:
    """A valid infer payload (unframed); a change replaces an array (joints, front, prefix, extra) or a header
    field, and None drops that field."""
    meta = {
        "kind": "infer",
        "instruction": "push",
        "joint_keys": JOINT_KEYS,
        "obs_time": 0.0,
        "inference_delay": 0,
    }
    arrays = {"joints": np.zeros(len(JOINT_KEYS)), "front": np.zeros((8, 8, 3), np.uint8)}
    for key, value in changes.items():
        if key in ("joints", "front", "prefix", "extra"):
            arrays[key] = value
        elif value is None:
            meta.pop(key)
        else:
            meta[key] = value
    return npz({"__meta__": meta_array(meta), **arrays})


def framed(payload: bytes) -> bytes:
    return struct.pack("!Q", len(payload)) + payload


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def malformed_message(rng: np.random.Generator) -> tuple[str, bytes, bool]:
    """(kind, bytes to send, whether to say hello first): one random bad message."""
    kind = rng.choice(
        [
            "random bytes",
            "random length",
            "truncated",
            "header is a list",
            "header not json",
            "no header",
            "missing field",
            "object array",
            "wrong joint keys",
            "bad joints",
            "nan obs_time",
            "negative delay",
            "bad prefix",
            "bad image",
            "shape lies",
            "unknown kind",
            "infer before hello",
            "flipped bytes",
        ]
    )
    n = int(rng.integers(0, 2000))
    hello = True
    if kind == "random bytes":
        message = framed(rng.bytes(n))
    elif kind == "random length":
        message = struct.pack("!Q", int(rng.integers(0, 2**63))) + rng.bytes(n)
    elif kind == "truncated":
        good = framed(infer_message())
        message = good[: int(rng.integers(1, len(good)))]
    elif kind == "header is a list":
        message = framed(npz({"__meta__": meta_array([1, 2, 3])}))
    elif kind == "header not json":
        message = framed(npz({"__meta__": np.frombuffer(rng.bytes(n + 1), dtype=np.uint8)}))
    elif kind == "no header":
        message = framed(npz({"joints": np.zeros(4)}))
    elif kind == "missing field":
        field = rng.choice(["instruction", "joint_keys", "obs_time", "inference_delay"])
        message = framed(infer_message(**{str(field): None}))
    elif kind == "object array":
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("__meta__.npy", _npy(meta_array({"kind": "infer"})))
            z.writestr("joints.npy", buf.getvalue())
        message = framed(archive.getvalue())
    elif kind == "wrong joint keys":
        message = framed(infer_message(joint_keys=[f"j{i}" for i in range(4)]))
    elif kind == "bad joints":
        message = framed(infer_message(joints=rng.integers(0, 9, size=int(rng.integers(0, 9)))))
    elif kind == "nan obs_time":
        message = framed(
            infer_message(obs_time=float("nan")) if rng.random() < 0.5 else infer_message(obs_time="soon")
        )
    elif kind == "negative delay":
        message = framed(infer_message(inference_delay=-int(rng.integers(1, 100))))
    elif kind == "bad prefix":
        message = framed(infer_message(prefix=rng.integers(0, 5, size=(3,))))
    elif kind == "bad image":
        message = framed(infer_message(front=rng.random((8, 8, 3))))
    elif kind == "shape lies":
        header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000), }"
        npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header) + 1) + header + b"\n" + b"\0" * 64
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("__meta__.npy", _npy(meta_array({"kind": "infer"})))
            z.writestr("joints.npy", npy)
        message = framed(archive.getvalue())
    elif kind == "unknown kind":
        message = framed(npz({"__meta__": meta_array({"kind": str(rng.integers(1000))})}))
    elif kind == "infer before hello":
        message, hello = framed(infer_message()), False
    else:  # a valid infer message with a few random bytes changed
        payload = bytearray(infer_message())
        for i in rng.integers(0, len(payload), size=int(rng.integers(1, 8))):
            payload[i] = int(rng.integers(0, 256))
        message = framed(bytes(payload))
    return str(kind), message, hello


def send_raw(server: PolicyServer, message: bytes, hello: bool) -> None:
    """One client sends `message` (after a hello where `hello`) and reads until the server drops it."""
    with socket.create_connection(server.address, timeout=5.0) as sock:
        if hello:
            sock.sendall(encode_message({"kind": "hello"}, {}))
            sock.recv(1 << 16)
        try:
            sock.sendall(message)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):  # until the server drops (or answers and then drops) the client
                pass
        except OSError:  # dropped before or while this was sent
            pass


# ---- a deploy run in its own process -------------------------------------------------------------------
def start_child(out: Path, *args: str) -> subprocess.Popen:
    """Start `python -m worldloop.real_robot.fault_injection OUT *args`; its stderr is piped (text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "worldloop.real_robot.fault_injection", str(out), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def read_sends(log: Path) -> np.ndarray:
    """The commands a child sent, one row per "send" line of its sent.log."""
    return np.array(
        [
            [float(v) for v in line.split()[1:]]
            for line in log.read_text().splitlines()
            if line.startswith("send")
        ]
    )


def count_sends(log: Path) -> int:
    """How many commands a child has sent so far (0 before its sent.log exists)."""
    return log.read_text().count("send") if log.exists() else 0


def saved_segments(root: Path) -> int:
    """How many segments a child's recording has saved so far (0 before its first save, or while the
    metadata is being rewritten)."""
    try:
        return len(json.loads((root / RECORDING_META).read_text())["episodes"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll `predicate` until it holds; TimeoutError naming `what` after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout}s for {what}")
        time.sleep(0.02)


class LoggedRobot:
    """Passes everything to `robot`, appending what it was told to do to `log`."""

    def __init__(self, robot, log: Path):
        self._robot, self._log = robot, log.open("a", buffering=1)

    def __getattr__(self, name):
        return getattr(self._robot, name)

    def connect(self, calibrate: bool = True) -> None:
        self._robot.connect()
        self._log.write("connect\n")

    def send_action(self, action: dict) -> dict:
        sent = self._robot.send_action(action)
        self._log.write("send " + " ".join(repr(float(v)) for v in action.values()) + "\n")
        return sent

    def disconnect(self) -> None:
        self._robot.disconnect()
        self._log.write("disconnect\n")


def main() -> None:
    # here, not at the top: the deploy stack (LeRobot's robots) takes seconds to import
    from worldloop.real_robot.deploy import DeployConfig, deploy
    from worldloop.real_robot.recorder import EpisodeRecorder

    parser = argparse.ArgumentParser(
        description="A deploy run for fault injection from outside (signals, kill -9)."
    )
    parser.add_argument("out")
    parser.add_argument("--robot", choices=("fake", "sim"), default="fake")
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--segment_s", type=float, default=0.5)
    parser.add_argument("--stop_hold_s", type=float, default=1.0)
    parser.add_argument("--episode_time_s", type=float, default=60.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    cfg = DeployConfig(episode_time_s=args.episode_time_s, stop_on_success=False)
    cfg.runtime.status_every_s = 0.0
    cfg.runtime.stop_hold_s = args.stop_hold_s
    cfg.robot.image_size = 32
    if args.robot == "fake":
        robot = FakeRobot(start=np.full(4, 0.2))
    else:
        from worldloop.real_robot.robots import make_robot

        robot = make_robot(cfg.robot, cfg.runtime.control_hz)
    if args.record:
        cfg.record.root = str(out / "run")
        cfg.record.segment_s = args.segment_s
        observed = (out / "observed.log").open("a", buffering=1)
        keys = [f"{j}.pos" for j in FakeRobot().joint_names]
        record = EpisodeRecorder.on_observation

        def on_observation(self, observation, now, last_command):
            observed.write(" ".join(repr(float(observation[k])) for k in keys) + "\n")
            record(self, observation, now, last_command)

        EpisodeRecorder.on_observation = on_observation
    try:
        deploy(
            cfg,
            policy=SlowSmoothPolicy(latency_s=0.02, amplitude=3.0),
            robot=LoggedRobot(robot, out / "sent.log"),
        )
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
