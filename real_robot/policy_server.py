"""Run the policy in another process or on another machine: a small TCP policy server and its client.

    python -m worldloop.real_robot.policy_server --policy_path DIR [--host 127.0.0.1 --port 8765]
    python deploy.py ... --policy_server=127.0.0.1:8765

The server binds to localhost unless told otherwise. Messages are length-prefixed `.npz` archives read
with `allow_pickle=False` (arrays and a JSON header only, nothing is unpickled), so a client can never
make the server run code. One client is served at a time; the client is a runner for `ThreadedInference`.
"""

from __future__ import annotations

import io
import json
import logging
import socket
import struct
from dataclasses import dataclass

import numpy as np

from worldloop.real_robot.helpers import check_policy_path, load_policy
from worldloop.real_robot.inference import InferenceRequest, PolicyRunner

logger = logging.getLogger(__name__)

_HEADER = struct.Struct("!Q")
_MAX_MESSAGE = 256 * 1024 * 1024


def _send(sock: socket.socket, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    payload = buf.getvalue()
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("policy server connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> tuple[dict, dict[str, np.ndarray]]:
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > _MAX_MESSAGE:
        raise ConnectionError(f"policy server message of {size} bytes exceeds the {_MAX_MESSAGE} byte limit")
    with np.load(io.BytesIO(_recv_exact(sock, size)), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    return meta, arrays


class PolicyServer:
    """Answers `hello` (chunk size, prefix support) and `infer` (observation -> chunk) messages."""

    def __init__(self, policy, joint_names: tuple[str, ...], host: str = "127.0.0.1", port: int = 8765):
        self.policy = policy
        self.runner = PolicyRunner(policy, joint_names, instruction="", use_prefix=True)
        self.sock = socket.create_server((host, port))
        self.address = self.sock.getsockname()[:2]

    def serve_forever(self) -> None:
        logger.info("policy server listening on %s:%d", *self.address)
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                logger.info("policy client %s connected", peer)
                try:
                    self._serve(conn)
                except ConnectionError as e:
                    logger.info("policy client %s left: %s", peer, e)

    def _serve(self, conn: socket.socket) -> None:
        while True:
            meta, arrays = _recv(conn)
            if meta.get("kind") == "hello":
                info = {"chunk_size": int(self.policy.chunk_size), "supports_prefix": self.runner.uses_prefix}
                _send(conn, info, {})
                continue
            self.runner.instruction = meta["instruction"]
            observation = {k: float(v) for k, v in zip(meta["joint_keys"], arrays.pop("joints"))}
            prefix = arrays.pop("prefix", None)
            observation.update(arrays)
            request = InferenceRequest(observation, meta["obs_time"], prefix, int(meta["inference_delay"]))
            _send(conn, {"kind": "chunk"}, {"actions": self.runner(request)})

    def close(self) -> None:
        self.sock.close()


class RemotePolicyClient:
    """A runner that sends each request to a `PolicyServer` and returns its chunk."""

    def __init__(self, address: str, instruction: str, timeout_s: float = 30.0):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"policy_server: expected HOST:PORT, got {address!r}")
        self.instruction = instruction
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        _send(self.sock, {"kind": "hello"}, {})
        info, _ = _recv(self.sock)
        self.chunk_size, self.uses_prefix = int(info["chunk_size"]), bool(info["supports_prefix"])

    def __call__(self, request: InferenceRequest) -> np.ndarray:
        obs = request.observation
        joint_keys = [k for k, v in obs.items() if not isinstance(v, np.ndarray)]
        arrays = {k: v for k, v in obs.items() if isinstance(v, np.ndarray)}
        arrays["joints"] = np.array([float(obs[k]) for k in joint_keys])
        if request.prefix is not None:
            arrays["prefix"] = np.asarray(request.prefix, dtype=np.float64)
        meta = {
            "kind": "infer",
            "instruction": self.instruction,
            "joint_keys": joint_keys,
            "obs_time": request.obs_time,
            "inference_delay": request.inference_delay,
        }
        _send(self.sock, meta, arrays)
        _, answer = _recv(self.sock)
        return answer["actions"]

    def close(self) -> None:
        self.sock.close()


def serve_pretrained(
    policy_path: str, robot_type: str, host: str, port: int, threads: int, ready=None
) -> None:
    """Load a policy and serve it until the process ends; `ready.put((host, port))` once listening."""
    import torch

    from worldloop.real_robot.robots import EMBODIMENTS

    if robot_type not in EMBODIMENTS:
        raise ValueError(f"robot_type: expected one of {sorted(EMBODIMENTS)}, got {robot_type!r}")
    torch.set_num_threads(threads)
    server = PolicyServer(load_policy(policy_path), EMBODIMENTS[robot_type].joint_names, host, port)
    if ready is not None:
        ready.put(server.address)
    try:
        server.serve_forever()
    finally:
        server.close()


def start_server_process(policy_path: str, robot_type: str, threads: int, timeout_s: float = 300.0):
    """A child process serving `policy_path` on a free localhost port: (process, "host:port")."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no GIL, no forked torch state
    ready = ctx.Queue()
    args = (policy_path, robot_type, "127.0.0.1", 0, threads, ready)
    process = ctx.Process(target=serve_pretrained, args=args, name="policy-server", daemon=True)
    process.start()
    try:
        host, port = ready.get(timeout=timeout_s)
    except Exception as e:
        process.terminate()
        raise RuntimeError(
            f"policy server process for {policy_path} did not start (exit code {process.exitcode})"
        ) from e
    return process, f"{host}:{port}"


@dataclass
class PolicyServerConfig:
    policy_path: str | None = None
    host: str = "127.0.0.1"  # localhost only unless told otherwise
    port: int = 8765
    robot_type: str = "sim"  # names the embodiment (joint order) the policy was trained on
    threads: int = 1


def main() -> None:
    from worldloop.common.config import parse_cli

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = parse_cli(PolicyServerConfig)
    check_policy_path(cfg.policy_path)
    try:
        serve_pretrained(cfg.policy_path, cfg.robot_type, cfg.host, cfg.port, cfg.threads)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
