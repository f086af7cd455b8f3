"""bench/bench_integrations.py's accounting and its receiving ends' counting
(bench/integration_sinks.py): payloads, medians, the --sinks option, the tally, the
webhook bodies."""

from __future__ import annotations

import argparse
import base64
import json

import pytest

from bench.bench_integrations import PAYLOAD_BYTES, Round, bench_payload, medians, parse_sinks
from bench.integration_sinks import Tally, webhook_payloads


def test_payloads_are_64_bytes_and_distinct_within_a_round() -> None:
    payloads = {bench_payload("0a1b2c3d", i) for i in range(1000)}
    assert len(payloads) == 1000
    assert {len(p) for p in payloads} == {PAYLOAD_BYTES}
    assert bench_payload("0a1b2c3d", 7).startswith(b"0a1b2c3d-0")
    with pytest.raises(ValueError):
        bench_payload("n" * 60, 12345)


def test_medians_of_rounds() -> None:
    rounds = [
        Round(100.0, 50.0, {"HTTP server": 9.0}, 5000, 0, 0, 2.0),
        Round(300.0, 40.0, {"HTTP server": 7.0}, 4999, 3, 10, 9.0),
        Round(200.0, 60.0, {"HTTP server": 8.0}, 5000, 1, 0, 4.0),
    ]
    assert medians(rounds) == Round(200.0, 50.0, {"HTTP server": 8.0}, 4999, 3, 10, 9.0)
    line = medians(rounds).figures(5000)
    assert line.startswith("200 msg/s, 50 µs CPU/msg (HTTP server 8 µs)")
    assert "arrived 4,999 of 5,000, 3 twice, 1 MISSING, 10 of earlier rounds" in line
    assert medians([Round(1.0, 2.0)]).distinct is None
    with pytest.raises(ValueError):
        medians([])


def test_sinks_option() -> None:
    assert parse_sinks("webhook, mqtt,webhook") == ["webhook", "mqtt"]
    for bad in ("", "kafka,http"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_sinks(bad)


def test_tally_counts_the_round_twice_and_strays() -> None:
    tally = Tally()
    tally.reset(b"r1")
    tally.add([b"r1-1", b"r1-2", b"r1-1", b"r0-9"])
    assert tally.snapshot() == {"messages": 3, "distinct": 2, "strays": 1}
    tally.reset(b"r2")
    tally.add([b"r1-3"])
    assert tally.snapshot() == {"messages": 0, "distinct": 0, "strays": 1}


def _document(payload: bytes, encoding: str) -> dict[str, str]:
    text = payload.decode() if encoding == "utf-8" else base64.b64encode(payload).decode()
    return {"schema": "cormorant.message/1", "payload": text, "payload_encoding": encoding}


def test_webhook_bodies_give_their_payloads() -> None:
    assert webhook_payloads(b"\x00raw", "application/octet-stream") == [b"\x00raw"]
    one = json.dumps(_document(b"r1-1", "utf-8")).encode()
    assert webhook_payloads(one, "application/json; charset=utf-8") == [b"r1-1"]
    batch = json.dumps([_document(b"r1-2", "utf-8"), _document(b"\xff", "base64")]).encode()
    assert webhook_payloads(batch, "application/json") == [b"r1-2", b"\xff"]
    with pytest.raises(ValueError):
        webhook_payloads(b"not json", "application/json")
    with pytest.raises(KeyError):
        webhook_payloads(b'{"topic": "t"}', "application/json")
