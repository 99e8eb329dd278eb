"""The policy server under fault injection: random and malformed messages, a decompression bomb (either
way), an idle and a slow client, off-loopback binding and the shared token. After every bad client the
server is still up and answers the next good one."""

from __future__ import annotations

import logging
import socket
import threading
import time

import numpy as np
import pytest

from worldloop.common.embodiment import TABLETOP_ARM
from worldloop.real_robot.fault_injection import (
    MESSAGE_LIMIT,
    SlowSmoothPolicy,
    answers_a_good_client,
    framed,
    good_request,
    infer_message,
    malformed_message,
    meta_array,
    npz,
    send_raw,
    server_address,
    start_policy_server,
)
from worldloop.real_robot.policy_server import PolicyServer, ProtocolError, RemotePolicyClient, decode_message

SPEC = TABLETOP_ARM


@pytest.fixture
def server():
    server, thread = start_policy_server()
    yield server
    server.close()
    thread.join(timeout=2.0)


def test_a_thousand_malformed_messages_drop_only_their_clients(server, caplog):
    rng = np.random.default_rng(0)
    kinds = {}
    with caplog.at_level(logging.ERROR, logger="worldloop.real_robot.policy_server"):
        for i in range(1000):
            kind, message, hello = malformed_message(rng)
            kinds[kind] = kinds.get(kind, 0) + 1
            send_raw(server, message, hello)
            if i % 250 == 249:
                assert answers_a_good_client(server), f"no answer after {i + 1} bad messages"
    assert len(kinds) == 18 and min(kinds.values()) > 20
    # every one that was not a clean (truncated) hang-up was a drop with a logged reason
    assert server.dropped >= 1000 - kinds["truncated"] - kinds["flipped bytes"]
    assert answers_a_good_client(server)


def test_a_decompression_bomb_is_refused_after_reading_the_cap(server):
    bomb = npz(
        {"__meta__": meta_array({"kind": "hello"}), "front": np.zeros(64 << 20, np.uint8)}, compressed=True
    )
    assert len(bomb) < MESSAGE_LIMIT  # passes the size check on the wire
    with pytest.raises(ProtocolError, match="decompresses to more than the 1048576 byte limit"):
        decode_message(bomb, MESSAGE_LIMIT)
    with socket.create_connection(server.address, timeout=5.0) as sock:
        sock.sendall(framed(bomb))
        answer = sock.recv(1 << 16)
    assert b"decompresses to more than" in answer  # the server said why, then dropped the client
    assert answers_a_good_client(server)


def test_the_client_caps_the_server_answers_too():
    bomb = npz(
        {
            "__meta__": meta_array({"chunk_size": 10, "supports_prefix": False}),
            "x": np.zeros(64 << 20, np.uint8),
        },
        compressed=True,
    )
    listener = socket.create_server(("127.0.0.1", 0))

    def evil_server():
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 << 16)
            conn.sendall(framed(bomb))
            time.sleep(0.5)

    threading.Thread(target=evil_server, daemon=True).start()
    host, port = listener.getsockname()[:2]
    with pytest.raises(ProtocolError, match="decompresses to more than"):
        RemotePolicyClient(f"{host}:{port}", "push", timeout_s=5.0, max_message_bytes=MESSAGE_LIMIT)
    listener.close()


def test_an_idle_and_a_slow_client_time_out_and_the_next_is_served(server):
    idle = socket.create_connection(server.address)  # connects, says nothing
    slow = None
    try:
        start = time.monotonic()
        assert answers_a_good_client(server)  # waited for the idle client's timeout, then served
        assert 0.4 < time.monotonic() - start < 5.0
        slow = socket.create_connection(server.address)
        slow.sendall(framed(infer_message())[:20])  # starts a message, never finishes it
        start = time.monotonic()
        assert answers_a_good_client(server)
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
                RemotePolicyClient(server_address(server), "push", timeout_s=5.0, token=token)
        client = RemotePolicyClient(server_address(server), "push", timeout_s=5.0, token="s3cret")
        assert client(good_request()).shape == (10, SPEC.num_joints)
        client.close()
    finally:
        server.close()
