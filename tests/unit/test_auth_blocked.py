"""Blocked clients and flapping detection (services/common/auth/blocked.py), decisions alone."""

from __future__ import annotations

import uuid

import pytest

from services.common.auth.blocked import (
    FLAPPING_CREATOR,
    Block,
    BlockError,
    BlockKind,
    BlockList,
    ConnectGate,
    FlapDetector,
    FlappingSettings,
    host_of,
    normalize,
)

NOW = 1_700_000_000_000


def block(kind: BlockKind, value: str, expires_at_ms: int | None = None) -> Block:
    return Block(uuid.uuid4(), kind, normalize(kind, value), "test", expires_at_ms)


def test_each_kind_matches_what_it_names_and_nothing_else() -> None:
    blocks = BlockList(
        [
            block(BlockKind.CLIENT_ID, "bad-client"),
            block(BlockKind.USERNAME, "mallory"),
            block(BlockKind.ADDRESS, "203.0.113.0/24"),
            block(BlockKind.ADDRESS, "2001:db8::1"),
            block(BlockKind.CLIENT_ID_REGEX, r"sensor-\d+"),
        ]
    )
    assert len(blocks) == 5
    hit = blocks.match("bad-client", None, "192.0.2.1:4000", NOW)
    assert hit is not None and hit.kind is BlockKind.CLIENT_ID
    hit = blocks.match("ok", "mallory", "192.0.2.1:4000", NOW)
    assert hit is not None and hit.kind is BlockKind.USERNAME
    hit = blocks.match("ok", "alice", "203.0.113.77:1", NOW)
    assert hit is not None and hit.value == "203.0.113.0/24"
    hit = blocks.match("ok", None, "[2001:db8::1]:1883", NOW)
    assert hit is not None and hit.value == "2001:db8::1/128"
    hit = blocks.match("sensor-17", None, "192.0.2.1:1", NOW)
    assert hit is not None and hit.kind is BlockKind.CLIENT_ID_REGEX
    # near misses
    assert blocks.match("bad-client-2", "alice", "192.0.2.1:4000", NOW) is None
    assert blocks.match("mallory", None, "203.0.114.1:1", NOW) is None  # id is not a user name
    assert blocks.match("my-sensor-17", None, "[2001:db8::2]:1", NOW) is None  # fullmatch
    assert blocks.match("sensor-17x", None, "", NOW) is None


def test_an_ipv4_mapped_peer_matches_its_ipv4_block() -> None:
    blocks = BlockList([block(BlockKind.ADDRESS, "10.0.0.0/8")])
    assert blocks.match("c", None, "[::ffff:10.9.8.7]:5000", NOW) is not None
    assert host_of("[::ffff:10.9.8.7]:5000") == host_of("10.9.8.7:5000")
    assert host_of("") is None


def test_an_expired_block_refuses_nothing_but_a_live_one_behind_it_still_does() -> None:
    blocks = BlockList(
        [
            block(BlockKind.CLIENT_ID, "c1", expires_at_ms=NOW),
            block(BlockKind.USERNAME, "u1", expires_at_ms=NOW + 1),
        ]
    )
    assert blocks.match("c1", None, "", NOW) is None
    hit = blocks.match("c1", "u1", "", NOW)
    assert hit is not None and hit.kind is BlockKind.USERNAME
    assert blocks.match("c1", "u1", "", NOW + 1) is None


def test_values_are_checked_and_addresses_normalised() -> None:
    assert normalize(BlockKind.ADDRESS, "10.1.2.3") == "10.1.2.3/32"
    assert normalize(BlockKind.ADDRESS, "10.1.2.3/8") == "10.0.0.0/8"
    assert normalize(BlockKind.ADDRESS, "::ffff:10.0.0.0/104") == "10.0.0.0/8"
    for kind, value, words in [
        (BlockKind.ADDRESS, "10.0.0.300", "not an IP address"),
        (BlockKind.ADDRESS, "example.com", "not an IP address"),
        (BlockKind.CLIENT_ID_REGEX, "sensor-(", "not a valid regular expression"),
        (BlockKind.CLIENT_ID, "", "needs a value"),
        (BlockKind.USERNAME, "x" * 1025, "at most 1024 bytes"),
    ]:
        with pytest.raises(BlockError, match=words):
            normalize(kind, value)


def test_a_catastrophic_expression_is_cut_short_and_refuses() -> None:
    """An operator's expression runs over what a client sends: a match that takes too long
    stops after the timeout and counts as a match (refuse rather than let in)."""
    blocks = BlockList([block(BlockKind.CLIENT_ID_REGEX, r"(a|aa)+$")])
    hit = blocks.match("a" * 40 + "!", None, "", NOW)
    assert hit is not None


def test_the_flap_detector_counts_connects_in_a_sliding_window() -> None:
    detector = FlapDetector(FlappingSettings(max_connects=3, window_seconds=10, block_seconds=60))
    assert [detector.connected("c", t) for t in (0, 1, 2)] == [False] * 3
    assert detector.connected("c", 3) is True  # the fourth within 10 s
    # counting starts afresh; connects spread wider than the window never trip it
    assert [detector.connected("c", t) for t in (20, 31, 42, 53, 64)] == [False] * 5
    assert detector.connected("other", 64) is False


def test_the_flap_detector_remembers_a_bounded_number_of_clients() -> None:
    detector = FlapDetector(FlappingSettings(1, 10, 60), max_clients=2)
    detector.connected("a", 0)
    detector.connected("b", 0)
    detector.connected("c", 0)  # "a" is dropped
    assert detector.connected("a", 1) is False
    assert detector.connected("c", 1) is True


def test_the_gate_blocks_a_flapping_client_for_the_block_time_on_this_node() -> None:
    gate = ConnectGate(FlappingSettings(max_connects=2, window_seconds=5, block_seconds=30))
    assert gate.check("c", None, "", NOW) is None
    assert gate.check("c", None, "", NOW + 1000) is None
    verdict = gate.check("c", None, "", NOW + 2000)
    assert verdict is not None and verdict.new
    flap = verdict.block
    assert (flap.kind, flap.value, flap.created_by) == (BlockKind.CLIENT_ID, "c", FLAPPING_CREATOR)
    assert flap.expires_at_ms == NOW + 2000 + 30_000
    again = gate.check("c", None, "", NOW + 3000)
    assert again is not None and not again.new and again.block == flap
    assert gate.check("c", None, "", NOW + 32_000) is None  # expired
    assert gate.check("d", None, "", NOW + 3000) is None


def test_the_gate_refuses_stored_blocks_and_counts_nothing_without_flapping() -> None:
    gate = ConnectGate()
    assert all(gate.check("c", None, "", NOW + i) is None for i in range(100))
    gate.blocks = BlockList([block(BlockKind.CLIENT_ID, "c")])
    verdict = gate.check("c", None, "", NOW)
    assert verdict is not None and not verdict.new


def test_a_stored_flapping_block_takes_over_from_the_nodes_own() -> None:
    """Once the node's flapping block is among the stored ones, the stored one decides: an
    operator who deletes it lets the client in on this node too."""
    gate = ConnectGate(FlappingSettings(max_connects=1, window_seconds=5, block_seconds=30))
    assert gate.check("c", None, "", NOW) is None
    verdict = gate.check("c", None, "", NOW + 1)
    assert verdict is not None and verdict.new
    gate.blocks = BlockList([verdict.block])  # stored, and loaded again
    assert gate.check("c", None, "", NOW + 2) is not None
    gate.blocks = BlockList()  # deleted by an operator
    assert gate.check("c", None, "", NOW + 3) is None
