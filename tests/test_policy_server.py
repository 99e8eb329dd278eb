"""The policy server under fault injection: random and malformed messages, a decompression bomb (either
way), an idle and a slow client, off-loopback binding and the shared token. After every bad client the
server is still up and answers the next good one."""

from __future__ import annotations

import io
import json
import logging
import socket
import struct
import threading
import time
import zipfile

import numpy as np
import pytest
from test_runtime_fakes import SlowSmoothPolicy

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.inference import InferenceRequest
from worldloop.real_robot.policy_server import (
    PolicyServer,
    ProtocolError,
    RemotePolicyClient,
    _encode,
    decode_message,
)

SPEC = TABLETOP_ARM
JOINT_KEYS = [f"{j}.pos" for j in SPEC.joint_names]
LIMIT = 1 << 20  # 1 MiB in these tests


@pytest.fixture
def server():
    server = PolicyServer(
        SlowSmoothPolicy(latency_s=0.0),
        SPEC.joint_names,
        port=0,
        idle_timeout_s=0.5,
        read_timeout_s=0.5,
        max_message_bytes=LIMIT,
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.close()
    thread.join(timeout=2.0)


def _address(server) -> str:
    return f"{server.address[0]}:{server.address[1]}"


def _good_request() -> InferenceRequest:
    obs = {k: 0.1 for k in JOINT_KEYS} | {"front": np.zeros((8, 8, 3), np.uint8)}
    return InferenceRequest(obs, 0.0)


def _answers_a_good_client(server) -> bool:
    client = RemotePolicyClient(_address(server), "push", timeout_s=5.0)
    try:
        return client(_good_request()).shape == (10, SPEC.num_joints)
    finally:
        client.close()


def _npz(arrays: dict, compressed: bool = False) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def _meta(meta) -> np.ndarray:
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


def _infer(**changes) -> bytes:
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
    return _npz({"__meta__": _meta(meta), **arrays})


def _framed(payload: bytes) -> bytes:
    return struct.pack("!Q", len(payload)) + payload


def _malformed(rng: np.random.Generator) -> tuple[str, bytes, bool]:
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
        message = _framed(rng.bytes(n))
    elif kind == "random length":
        message = struct.pack("!Q", int(rng.integers(0, 2**63))) + rng.bytes(n)
    elif kind == "truncated":
        good = _framed(_infer())
        message = good[: int(rng.integers(1, len(good)))]
    elif kind == "header is a list":
        message = _framed(_npz({"__meta__": _meta([1, 2, 3])}))
    elif kind == "header not json":
        message = _framed(_npz({"__meta__": np.frombuffer(rng.bytes(n + 1), dtype=np.uint8)}))
    elif kind == "no header":
        message = _framed(_npz({"joints": np.zeros(4)}))
    elif kind == "missing field":
        field = rng.choice(["instruction", "joint_keys", "obs_time", "inference_delay"])
        message = _framed(_infer(**{str(field): None}))
    elif kind == "object array":
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("__meta__.npy", _npy(_meta({"kind": "infer"})))
            z.writestr("joints.npy", buf.getvalue())
        message = _framed(archive.getvalue())
    elif kind == "wrong joint keys":
        message = _framed(_infer(joint_keys=[f"j{i}" for i in range(4)]))
    elif kind == "bad joints":
        message = _framed(_infer(joints=rng.integers(0, 9, size=int(rng.integers(0, 9)))))
    elif kind == "nan obs_time":
        message = _framed(_infer(obs_time=float("nan")) if rng.random() < 0.5 else _infer(obs_time="soon"))
    elif kind == "negative delay":
        message = _framed(_infer(inference_delay=-int(rng.integers(1, 100))))
    elif kind == "bad prefix":
        message = _framed(_infer(prefix=rng.integers(0, 5, size=(3,))))
    elif kind == "bad image":
        message = _framed(_infer(front=rng.random((8, 8, 3))))
    elif kind == "shape lies":
        header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (100000, 100000), }"
        npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header) + 1) + header + b"\n" + b"\0" * 64
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("__meta__.npy", _npy(_meta({"kind": "infer"})))
            z.writestr("joints.npy", npy)
        message = _framed(archive.getvalue())
    elif kind == "unknown kind":
        message = _framed(_npz({"__meta__": _meta({"kind": str(rng.integers(1000))})}))
    elif kind == "infer before hello":
        message, hello = _framed(_infer()), False
    else:  # a valid infer message with a few random bytes changed
        payload = bytearray(_infer())
        for i in rng.integers(0, len(payload), size=int(rng.integers(1, 8))):
            payload[i] = int(rng.integers(0, 256))
        message = _framed(bytes(payload))
    return str(kind), message, hello


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _send_raw(server, message: bytes, hello: bool) -> None:
    with socket.create_connection(server.address, timeout=5.0) as sock:
        if hello:
            sock.sendall(_encode({"kind": "hello"}, {}))
            sock.recv(1 << 16)
        try:
            sock.sendall(message)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(1 << 16):  # until the server drops (or answers and then drops) the client
                pass
        except OSError:  # dropped before or while this was sent
            pass


def test_a_thousand_malformed_messages_drop_only_their_clients(server, caplog):
    rng = np.random.default_rng(0)
    kinds = {}
    with caplog.at_level(logging.ERROR, logger="worldloop.real_robot.policy_server"):
        for i in range(1000):
            kind, message, hello = _malformed(rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            _send_raw(server, message, hello)
            if i % 250 == 249:
                assert _answers_a_good_client(server), f"no answer after {i + 1} bad messages"
    assert len(kinds) == 18 and min(kinds.values()) > 20
    # every one that was not a clean (truncated) hang-up was a drop with a logged reason
    assert server.dropped >= 1000 - kinds["truncated"] - kinds["flipped bytes"]
    assert _answers_a_good_client(server)


def test_a_decompression_bomb_is_refused_after_reading_the_cap(server):
    bomb = _npz(
        {"__meta__": _meta({"kind": "hello"}), "front": np.zeros(64 << 20, np.uint8)}, compressed=True
    )
    assert len(bomb) < LIMIT  # passes the size check on the wire
    with pytest.raises(ProtocolError, match="decompresses to more than the 1048576 byte limit"):
        decode_message(bomb, LIMIT)
    with socket.create_connection(server.address, timeout=5.0) as sock:
        sock.sendall(_framed(bomb))
        answer = sock.recv(1 << 16)
    assert b"decompresses to more than" in answer  # the server said why, then dropped the client
    assert _answers_a_good_client(server)


def test_the_client_caps_the_server_answers_too():
    bomb = _npz(
        {"__meta__": _meta({"chunk_size": 10, "supports_prefix": False}), "x": np.zeros(64 << 20, np.uint8)},
        compressed=True,
    )
    listener = socket.create_server(("127.0.0.1", 0))

    def evil_server():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(_framed(bomb))
            time.sleep(0.5)

    threading.Thread(target=evil_server, daemon=True).start()
    host, port = listener.getsockname()[:2]
    with pytest.raises(ProtocolError, match="decompresses to more than"):
        RemotePolicyClient(f"{host}:{port}", "push", timeout_s=5.0, max_message_bytes=LIMIT)
    listener.close()


def test_an_idle_and_a_slow_client_time_out_and_the_next_is_served(server):
    idle = socket.create_connection(server.address)  # connects, says nothing
    slow = None
    try:
        start = time.monotonic()
        assert _answers_a_good_client(server)  # waited for the idle client's timeout, then served
        assert 0.4 < time.monotonic() - start < 5.0
        slow = socket.create_connection(server.address)
        slow.sendall(_framed(_infer())[:20])  # starts a message, never finishes it
        start = time.monotonic()
        assert _answers_a_good_client(server)
        assert time.monotonic() - start < 5.0
    finally:
        idle.close()
        if slow is not None:
            slow.close()


def test_binding_off_loopback_needs_the_flag_and_warns(caplog):
    policy = SlowSmoothPolicy(latency_s=0.0)
    with pytest.raises(ValueError, match="not a loopback address.*--allow_remote=true"):
        PolicyServer(policy, SPEC.joint_names, host="0.0.0.0", port=0)
    with caplog.at_level(logging.WARNING, logger="worldloop.real_robot.policy_server"):
        server = PolicyServer(policy, SPEC.joint_names, host="0.0.0.0", port=0, allow_remote=True)
    server.close()
    assert "reachable from the network; NO token is set" in caplog.text


def test_a_shared_token_is_required_when_set():
    server = PolicyServer(SlowSmoothPolicy(latency_s=0.0), SPEC.joint_names, port=0, token="s3cret")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for token in (None, "wrong"):
            with pytest.raises(
                ProtocolError, match="refused the request: ProtocolError: hello: wrong or missing token"
            ):
                RemotePolicyClient(_address(server), "push", timeout_s=5.0, token=token)
        client = RemotePolicyClient(_address(server), "push", timeout_s=5.0, token="s3cret")
        assert client(_good_request()).shape == (10, SPEC.num_joints)
        client.close()
    finally:
        server.close()
