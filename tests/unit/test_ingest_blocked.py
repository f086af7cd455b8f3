"""Blocked clients in the sans-IO core: refused at CONNECT before their credentials are
checked (services/ingest/handle_connect.py), with bytes alone."""

from __future__ import annotations

import uuid

import pytest
from test_ingest_support import NOW_MS, Client, closes, of_type, only

from services.common.auth.blocked import (
    Block,
    BlockKind,
    BlockList,
    ConnectGate,
    FlappingSettings,
    normalize,
)
from services.common.mqtt.packets import ConnAck, Connect
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import EventKind
from services.ingest.effects import Authenticate, LimitRefused
from services.ingest.limits import Refusal


def gate_of(*blocks: tuple[BlockKind, str]) -> ConnectGate:
    gate = ConnectGate()
    gate.blocks = BlockList(
        Block(uuid.uuid4(), kind, normalize(kind, value), "abuse") for kind, value in blocks
    )
    return gate


def blocked_client(version: int, gate: ConnectGate, address: str = "192.0.2.9:5000") -> Client:
    client = Client(
        version,
        authenticate=None,
        blocked=lambda c, u, a: gate.check(c, u, a, NOW_MS),
    )
    client.conn.state.client_address = address
    return client


@pytest.mark.parametrize(("version", "code"), [(5, ReasonCode.BANNED), (4, 5)])
@pytest.mark.parametrize(
    ("block", "client_id", "username", "address"),
    [
        ((BlockKind.CLIENT_ID, "bad"), "bad", None, "192.0.2.9:5000"),
        ((BlockKind.USERNAME, "mallory"), "ok", "mallory", "192.0.2.9:5000"),
        ((BlockKind.ADDRESS, "198.51.100.0/24"), "ok", "alice", "198.51.100.7:40000"),
        ((BlockKind.CLIENT_ID_REGEX, "bot-[0-9]+"), "bot-42", None, "192.0.2.9:5000"),
    ],
)
def test_a_blocked_connect_is_banned_before_its_credentials_are_checked(
    version: int,
    code: int,
    block: tuple[BlockKind, str],
    client_id: str,
    username: str | None,
    address: str,
) -> None:
    client = blocked_client(version, gate_of(block), address)
    password = None if username is None else b"pw"
    effects = client.send(Connect(version, client_id, True, 30, username, password))
    assert not of_type(effects, Authenticate)  # no hashing for a blocked client
    connack = only(client.packets(effects), ConnAck)
    assert connack.reason_code == code
    if version == 5:  # nothing about which block refused it
        assert "abuse" not in (connack.properties.reason_string or "")
    assert closes(effects)
    refused = only(effects, LimitRefused)
    assert refused.refusal is Refusal.BLOCKED and block[1].split("/")[0] in refused.detail
    assert client.conn.client_id == client_id  # the refusal is logged per client id
    assert [e.event.kind for e in client.events] == [EventKind.AUTH_FAILED]


def test_a_client_nothing_blocks_goes_on_to_authentication() -> None:
    client = blocked_client(5, gate_of((BlockKind.CLIENT_ID, "bad"), (BlockKind.USERNAME, "m")))
    effects = client.send(Connect(5, "good", True, 30, "alice", b"pw"))
    assert only(effects, Authenticate).request.client_id == "good"
    assert not of_type(effects, LimitRefused)


def test_a_flapping_client_is_banned_once_it_connects_too_often() -> None:
    gate = ConnectGate(FlappingSettings(max_connects=3, window_seconds=10, block_seconds=60))
    outcomes = []
    for _ in range(5):
        client = blocked_client(4, gate)
        effects = client.send(Connect(4, "flappy", True, 30))
        outcomes.append(bool(of_type(effects, Authenticate)))
    assert outcomes == [True, True, True, False, False]
    other = blocked_client(4, gate)
    assert of_type(other.send(Connect(4, "steady", True, 30)), Authenticate)
