"""The webhook's decisions without I/O: which lane and which request each message goes
in (order per Client Identifier), what a request's body is, the backoff between attempts,
and the dead-letter record format."""

from __future__ import annotations

import json
import uuid

import pytest
from tenacity import AsyncRetrying, RetryCallState

from services.common.integrations.dead_letter import (
    DeadLetter,
    dead_letter_record,
    parse_dead_letter,
)
from services.common.integrations.model import PayloadFormat, WebhookSink
from services.common.kafka.names import TopicNames
from services.common.records import RecordError
from services.integrations.matching import Outgoing
from services.integrations.webhook import backoff, encode, lanes, requests_of


def message(client_id: str, n: int, topic: str = "plant/1") -> Outgoing:
    return Outgoing(client_id, topic, 1, False, json.dumps({"n": n}).encode(), [])


def test_a_client_keeps_its_lane_and_its_order_and_lanes_are_bounded() -> None:
    messages = [message(f"c{n % 7}", n) for n in range(70)]
    split = lanes(messages, 3)
    assert 1 <= len(split) <= 3
    assert sorted(m.value for lane in split for m in lane) == sorted(m.value for m in messages)
    for lane in split:
        for client in {m.client_id for m in lane}:
            # All of a client's messages, in the order given.
            assert [m for m in lane if m.client_id == client] == [
                m for m in messages if m.client_id == client
            ]
    # A client is in one lane only.
    assert sum(len({m.client_id for m in lane}) for lane in split) == 7
    assert lanes(messages, 1) == [messages]


def test_requests_hold_batch_size_messages_in_order() -> None:
    lane = [message("c", n) for n in range(7)]
    assert [len(r) for r in requests_of(lane, 3)] == [3, 3, 1]
    assert [m for r in requests_of(lane, 3) for m in r] == lane
    assert requests_of(lane, 1) == [[m] for m in lane]


def test_a_request_body_is_the_message_or_a_json_array_of_them() -> None:
    one = message("sensor 7/é", 1, "plant/é 1")
    body, headers = encode([one], WebhookSink("http://h/"), PayloadFormat.JSON)
    assert body == one.value
    assert headers == {
        "Content-Type": "application/json",
        "X-Cormorant-Topic": "plant/%C3%A9%201",
        "X-Cormorant-Client-Id": "sensor%207%2F%C3%A9",
    }
    raw = Outgoing("c", "t", 0, False, b"\x00\xff", [])
    body, headers = encode([raw], WebhookSink("http://h/"), PayloadFormat.RAW)
    assert (body, headers["Content-Type"]) == (b"\x00\xff", "application/octet-stream")
    batch = [message("a", 1), message("b", 2)]
    body, headers = encode(batch, WebhookSink("http://h/", batch_size=5), PayloadFormat.JSON)
    assert json.loads(body) == [{"n": 1}, {"n": 2}]
    assert headers == {"Content-Type": "application/json"}


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 6, 7, 8])
def test_backoff_doubles_with_jitter_up_to_its_longest(attempt: int) -> None:
    sink = WebhookSink("http://h/", backoff_seconds=0.5, backoff_max_seconds=10)
    state = RetryCallState(AsyncRetrying(), None, (), {})
    state.attempt_number = attempt
    floor = min(0.5 * 2 ** (attempt - 1), 9.5)  # the longest less the jitter
    waits = [backoff(sink)(state) for _ in range(200)]
    assert all(floor <= wait <= floor + 0.5 <= 10.0 for wait in waits)
    assert max(waits) > min(waits)  # jittered: not every stage retries at once


def test_dead_letters_round_trip_and_other_records_are_refused() -> None:
    letter = DeadLetter(
        "sensor-7", "plant/1", b'{"n":1}', "hook", uuid.uuid4(), 5, "answered HTTP 500", 17
    )
    record = dead_letter_record(TopicNames("t."), letter)
    assert (record.topic, record.key) == ("t.integrations.dead-letter", b"sensor-7")
    assert parse_dead_letter(record.key, record.value, record.headers) == letter
    with pytest.raises(RecordError, match=r"not a cormorant\.dead-letter/1"):
        parse_dead_letter(b"k", b"v", [("dead_letter", b"other/1")])
    with pytest.raises(RecordError, match="malformed"):
        parse_dead_letter(b"k", b"v", [("dead_letter", b"cormorant.dead-letter/1")])
