"""Run the policy in another process or on another machine: a small TCP policy server and its client.

    python -m worldloop.real_robot.policy_server --policy_path DIR [--host 127.0.0.1 --port 8765]
    python deploy.py ... --policy_server=127.0.0.1:8765

Messages are length-prefixed `.npz` archives of plain arrays and a JSON header. Nothing is unpickled and
every size is bounded: the archive is read member by member with at most `max_message_bytes` of
decompressed data in all, each array's declared shape must match its bytes, and object or structured
arrays are refused, so a client (or a server, for the client) can neither run code nor make the other
side allocate more than the cap. A malformed message, a wrong token, a client idle for
`idle_timeout_s` or a message that takes longer than `read_timeout_s` to arrive drops that client only;
the server goes on with the next. One client is served at a time; the client is a runner for
`ThreadedInference`.

The server binds to localhost. Another address needs `--allow_remote=true` (a warning is printed); set a
shared token then (environment variable `WORLDLOOP_POLICY_TOKEN`, read by the server and by `deploy.py`):
a client must present it in its first message. The token travels in clear text: across an untrusted
network, tunnel the port (ssh -L) instead.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import json
import logging
import os
import socket
import struct
import time
import zipfile
from dataclasses import dataclass

import numpy as np

from worldloop.real_robot.helpers import check_number, check_policy_path, load_policy
from worldloop.real_robot.inference import InferenceRequest, PolicyRunner

logger = logging.getLogger(__name__)

TOKEN_ENV = "WORLDLOOP_POLICY_TOKEN"
_HEADER = struct.Struct("!Q")
MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # a few full-HD camera frames; far above a 640x480 observation
_MAX_ARRAYS = 64
_DTYPE_KINDS = "biuf"  # bool, integers, floats: nothing with objects, fields or strings


class ProtocolError(ValueError):
    """A message that does not follow the protocol (the connection is dropped)."""


def encode_message(meta: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """One length-prefixed message: the JSON header `meta` and the arrays in an `.npz` (`decode_message`
    reads it back, without the prefix)."""
    buf = io.BytesIO()
    np.savez(buf, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    payload = buf.getvalue()
    return _HEADER.pack(len(payload)) + payload


def _send(sock: socket.socket, meta: dict, arrays: dict[str, np.ndarray], limit: int) -> None:
    message = encode_message(meta, arrays)
    if len(message) - _HEADER.size > limit:
        raise ProtocolError(f"outgoing message of {len(message)} bytes exceeds the {limit} byte limit")
    sock.sendall(message)


def _recv_exact(sock: socket.socket, n: int, deadline: float | None) -> bytes:
    chunks, left = [], n
    while left:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("a message took longer than the read timeout to arrive")
            sock.settimeout(remaining)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("policy server connection closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(
    sock: socket.socket, limit: int, idle_timeout_s: float | None, read_timeout_s: float | None
) -> tuple[dict, dict[str, np.ndarray]]:
    """One message: waits up to `idle_timeout_s` for it to start, `read_timeout_s` for the rest."""
    sock.settimeout(idle_timeout_s)
    first = _recv_exact(sock, 1, None)
    deadline = None if read_timeout_s is None else time.monotonic() + read_timeout_s
    (size,) = _HEADER.unpack(first + _recv_exact(sock, _HEADER.size - 1, deadline))
    if size > limit:
        raise ProtocolError(f"message of {size} bytes exceeds the {limit} byte limit")
    return decode_message(_recv_exact(sock, size, deadline), limit)


def decode_message(payload: bytes, limit: int) -> tuple[dict, dict[str, np.ndarray]]:
    """The JSON header and arrays of one `.npz` message, reading at most `limit` decompressed bytes."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(payload))
        members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise ProtocolError(f"not an npz archive: {e}") from e
    if len(members) > _MAX_ARRAYS:
        raise ProtocolError(f"{len(members)} arrays in one message; at most {_MAX_ARRAYS}")
    arrays, total = {}, 0
    for member in members:
        name = member.filename.removesuffix(".npy")
        try:
            with archive.open(member) as f:
                raw = f.read(limit - total + 1)  # bounded whatever the member's header claims
        except (zipfile.BadZipFile, NotImplementedError, ValueError, OSError, EOFError) as e:
            raise ProtocolError(f"array {name!r}: unreadable ({e})") from e
        total += len(raw)
        if total > limit:
            raise ProtocolError(f"message decompresses to more than the {limit} byte limit")
        arrays[name] = _decode_array(name, raw)
    meta_bytes = arrays.pop("__meta__", None)
    if meta_bytes is None or meta_bytes.dtype != np.uint8 or meta_bytes.ndim != 1:
        raise ProtocolError("no JSON header (__meta__ uint8 array)")
    try:
        meta = json.loads(meta_bytes.tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"JSON header: {e}") from e
    if not isinstance(meta, dict):
        raise ProtocolError(f"JSON header must be an object, got {type(meta).__name__}")
    return meta, arrays


def _decode_array(name: str, raw: bytes) -> np.ndarray:
    """An `.npy` member whose declared shape and plain dtype account for exactly its bytes (numpy's own
    reader would allocate the declared shape before finding the data short)."""
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }[version]
        shape, fortran_order, dtype = read_header(buf)
    except (ValueError, KeyError, TypeError, SyntaxError, EOFError) as e:
        raise ProtocolError(f"array {name!r}: not an .npy array ({e})") from e
    if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ProtocolError(f"array {name!r}: dtype {dtype} is not allowed (bool, integer or float only)")
    data = raw[buf.tell() :]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(
            f"array {name!r}: shape {shape} of {dtype} needs {expected} bytes, got {len(data)}"
        )
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran_order else "C").copy()


def _infer_request(meta: dict, arrays: dict[str, np.ndarray]) -> InferenceRequest:
    """An `infer` message as an inference request, every field checked."""
    instruction, joint_keys = meta.get("instruction"), meta.get("joint_keys")
    obs_time, delay = meta.get("obs_time"), meta.get("inference_delay")
    if not isinstance(instruction, str):
        raise ProtocolError("infer: 'instruction' must be a string")
    if not isinstance(joint_keys, list) or not all(isinstance(k, str) for k in joint_keys):
        raise ProtocolError("infer: 'joint_keys' must be a list of strings")
    joints = arrays.pop("joints", None)
    if joints is None or joints.shape != (len(joint_keys),) or joints.dtype.kind != "f":
        raise ProtocolError(f"infer: 'joints' must be {len(joint_keys)} floats, one per joint key")
    try:
        check_number("infer: 'obs_time'", obs_time)
        check_number("infer: 'inference_delay'", delay, low=0, integer=True)
    except ValueError as e:
        raise ProtocolError(str(e)) from e
    prefix = arrays.pop("prefix", None)
    if prefix is not None and (prefix.ndim != 2 or prefix.dtype.kind != "f"):
        raise ProtocolError(
            f"infer: 'prefix' must be a [P, D] float array, got {prefix.shape} {prefix.dtype}"
        )
    for key, image in arrays.items():
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ProtocolError(
                f"infer: camera {key!r} must be a uint8 HxWx3 image, got {image.shape} {image.dtype}"
            )
    observation = {k: float(v) for k, v in zip(joint_keys, joints)}
    observation.update(arrays)
    return InferenceRequest(observation, float(obs_time), prefix, int(delay))


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address (localhost, 127.0.0.0/8, ::1)."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as e:
        raise ValueError(f"policy server host {host!r}: cannot resolve it ({e})") from e
    return all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


class PolicyServer:
    """Answers `hello` (chunk size, prefix support) and `infer` (observation -> chunk) messages.

    Binding to a non-loopback `host` needs `allow_remote`. With a `token`, a client's `hello` must carry
    it. Any bad message, a wrong token, or a timeout drops that client and the server waits for the next.
    """

    def __init__(
        self,
        policy,
        joint_names: tuple[str, ...],
        host: str = "127.0.0.1",
        port: int = 8765,
        allow_remote: bool = False,
        token: str | None = None,
        idle_timeout_s: float = 60.0,
        read_timeout_s: float = 10.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        check_number("policy server idle_timeout_s", idle_timeout_s, low=0.0, low_open=True)
        check_number("policy server read_timeout_s", read_timeout_s, low=0.0, low_open=True)
        check_number("policy server max_message_bytes", max_message_bytes, low=1024, integer=True)
        if not is_loopback(host):
            if not allow_remote:
                raise ValueError(
                    f"policy server host {host!r} is not a loopback address: the policy would be reachable "
                    "from the network. Pass --allow_remote=true to mean it (and set a token in "
                    f"${TOKEN_ENV}), or tunnel the port (ssh -L) instead"
                )
            logger.warning(
                "policy server: binding to %r, reachable from the network; %s",
                host,
                "clients must present the shared token" if token else f"NO token is set (${TOKEN_ENV})",
            )
        self.policy = policy
        self.runner = PolicyRunner(policy, joint_names, instruction="", use_prefix=True)
        self.token = token
        self.idle_timeout_s, self.read_timeout_s = idle_timeout_s, read_timeout_s
        self.max_message_bytes = int(max_message_bytes)
        self.dropped = 0  # clients dropped for a bad message, a wrong token or a timeout
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
                except Exception as e:  # a bad client must not end the server
                    self.dropped += 1
                    logger.warning("policy client %s dropped: %s: %s", peer, type(e).__name__, e)
                    self._tell(conn, f"{type(e).__name__}: {e}")

    def _tell(self, conn: socket.socket, message: str) -> None:
        """Best effort: say why the connection is being dropped."""
        try:
            conn.settimeout(1.0)
            _send(conn, {"kind": "error", "message": message[:1000]}, {}, self.max_message_bytes)
        except OSError:
            pass

    def _serve(self, conn: socket.socket) -> None:
        greeted = False
        while True:
            meta, arrays = _recv(conn, self.max_message_bytes, self.idle_timeout_s, self.read_timeout_s)
            kind = meta.get("kind")
            if kind == "hello":
                token = meta.get("token")
                if self.token is not None and not (
                    isinstance(token, str) and hmac.compare_digest(token.encode(), self.token.encode())
                ):
                    raise ProtocolError("hello: wrong or missing token")
                greeted = True
                info = {"chunk_size": int(self.policy.chunk_size), "supports_prefix": self.runner.uses_prefix}
                _send(conn, info, {}, self.max_message_bytes)
            elif kind == "infer":
                if not greeted:
                    raise ProtocolError("infer before hello")
                request = _infer_request(meta, arrays)
                self.runner.instruction = meta["instruction"]
                actions = self.runner(request)
                _send(conn, {"kind": "chunk"}, {"actions": actions}, self.max_message_bytes)
            else:
                raise ProtocolError(f"unknown message kind {kind!r}; expected 'hello' or 'infer'")

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept (close alone does not)
        except OSError:
            pass
        self.sock.close()


class RemotePolicyClient:
    """A runner that sends each request to a `PolicyServer` and returns its chunk. Answers are read with
    the same bounds as requests (size after decompression, plain arrays, `timeout_s`)."""

    def __init__(
        self,
        address: str,
        instruction: str,
        timeout_s: float = 30.0,
        token: str | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"policy_server: expected HOST:PORT, got {address!r}")
        self.instruction = instruction
        self.timeout_s, self.max_message_bytes = timeout_s, max_message_bytes
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        hello = {"kind": "hello"} if token is None else {"kind": "hello", "token": token}
        _send(self.sock, hello, {}, max_message_bytes)
        info, _ = self._answer()
        chunk_size, prefix = info.get("chunk_size"), info.get("supports_prefix")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ProtocolError(f"policy server {address}: hello answer has no valid chunk_size: {info}")
        self.chunk_size, self.uses_prefix = chunk_size, bool(prefix)

    def _answer(self) -> tuple[dict, dict[str, np.ndarray]]:
        meta, arrays = _recv(self.sock, self.max_message_bytes, self.timeout_s, self.timeout_s)
        if meta.get("kind") == "error":
            raise ProtocolError(f"policy server refused the request: {meta.get('message')}")
        return meta, arrays

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
        _send(self.sock, meta, arrays, self.max_message_bytes)
        _, answer = self._answer()
        actions = answer.get("actions")
        if actions is None or actions.ndim != 2 or actions.dtype.kind != "f":
            shape = None if actions is None else (actions.shape, str(actions.dtype))
            raise ProtocolError(
                f"policy server answer: expected 'actions' as a [H, D] float array, got {shape}"
            )
        return actions

    def close(self) -> None:
        self.sock.close()


def serve_pretrained(
    policy_path: str,
    robot_type: str,
    host: str,
    port: int,
    threads: int,
    ready=None,
    allow_remote: bool = False,
    token: str | None = None,
) -> None:
    """Load a policy and serve it until the process ends; `ready.put((host, port))` once listening."""
    import torch

    from worldloop.real_robot.robots import EMBODIMENTS

    if robot_type not in EMBODIMENTS:
        raise ValueError(f"robot_type: expected one of {sorted(EMBODIMENTS)}, got {robot_type!r}")
    torch.set_num_threads(threads)
    policy = load_policy(policy_path)
    server = PolicyServer(policy, EMBODIMENTS[robot_type].joint_names, host, port, allow_remote, token)
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
    allow_remote: bool = False  # needed to bind to a non-loopback host (then set $WORLDLOOP_POLICY_TOKEN)

    def __post_init__(self) -> None:
        check_number("port", self.port, low=0, high=65535, integer=True)
        check_number("threads", self.threads, low=1, integer=True)


def main() -> None:
    from worldloop.common.config import parse_cli

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = parse_cli(PolicyServerConfig)
    check_policy_path(cfg.policy_path)
    token = os.environ.get(TOKEN_ENV) or None
    try:
        serve_pretrained(
            cfg.policy_path, cfg.robot_type, cfg.host, cfg.port, cfg.threads, None, cfg.allow_remote, token
        )
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
