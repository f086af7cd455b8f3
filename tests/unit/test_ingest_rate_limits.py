"""The ingest node's token buckets (:mod:`services.ingest.rate_limits`) and its refusal
counters and throttled log (:mod:`services.ingest.refusals`), on a clock the test moves."""

from __future__ import annotations

import logging

import pytest

from services.ingest.limits import Refusal
from services.ingest.rate_limits import PRUNE_AT, Admission, ClientRate, TokenBucket
from services.ingest.refusals import LOG_INTERVAL, Refusals


def test_a_bucket_goes_into_debt_and_says_how_long_it_lasts() -> None:
    bucket = TokenBucket(rate=10, capacity=10, now=0.0)
    assert bucket.take(10, 0.0) == 0.0
    assert bucket.take(5, 0.0) == pytest.approx(0.5)  # 5 tokens owed at 10/s
    assert bucket.take(0, 0.5) == 0.0  # paid back
    assert bucket.take(10, 1.5) == 0.0  # refilled to its capacity, no more


def test_try_take_takes_only_what_is_there() -> None:
    bucket = TokenBucket(rate=2, capacity=2, now=0.0)
    assert bucket.try_take(1, 0.0) and bucket.try_take(1, 0.0)
    assert not bucket.try_take(1, 0.0)
    assert bucket.try_take(1, 0.5)
    assert not bucket.full(0.5) and bucket.full(1.5)
    with pytest.raises(ValueError):
        TokenBucket(0, 1, 0.0)


def test_admission_refuses_past_max_connections_until_one_closes() -> None:
    admission = Admission(max_connections=2, rate=0, rate_per_address=0)
    for _ in range(2):
        assert admission.admit("10.0.0.1", 0.0) is None
        admission.opened()
    assert admission.admit("10.0.0.2", 0.0) is Refusal.CONNECTIONS
    admission.closed()
    assert admission.admit("10.0.0.2", 0.0) is None


def test_admission_rates_per_node_and_per_address() -> None:
    admission = Admission(max_connections=100, rate=3, rate_per_address=2)
    assert admission.admit("a", 0.0) is None
    assert admission.admit("a", 0.0) is None
    assert admission.admit("a", 0.0) is Refusal.ADDRESS_CONNECTION_RATE
    assert admission.admit("b", 0.0) is None  # another address has its own bucket
    assert admission.admit("c", 0.0) is Refusal.CONNECTION_RATE  # the node's 3/s are used
    assert admission.admit("c", 1.0) is None  # a second later, refilled


def test_idle_addresses_are_forgotten() -> None:
    admission = Admission(max_connections=10**6, rate=0, rate_per_address=1)
    for i in range(PRUNE_AT):
        assert admission.admit(f"10.0.{i // 256}.{i % 256}", 0.0) is None
    assert admission.admit("new", 5.0) is None  # the full buckets were dropped first
    assert len(admission._addresses) == 1


def test_client_rate_pauses_for_the_longer_of_its_limits() -> None:
    rate = ClientRate(messages_per_second=100, bytes_per_second=1000, now=0.0)
    assert rate.take(100, 1000, 0.0) == (0.0, None)
    pause, limit = rate.take(1, 2000, 0.0)
    assert limit is Refusal.BYTE_RATE and pause == pytest.approx(2.0)
    pause, limit = rate.take(300, 0, 0.0)
    assert limit is Refusal.MESSAGE_RATE and pause == pytest.approx(3.01)
    assert not ClientRate(0, 0, 0.0).limited


def test_refusals_are_counted_each_and_logged_once_per_client_per_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    refusals = Refusals(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="services.ingest.refusals"):
        for _ in range(5):
            refusals.note(Refusal.MESSAGE_RATE, "flooder", "reading paused")
        refusals.note(Refusal.MESSAGE_RATE, "other", "reading paused")
        refusals.note(Refusal.SUBSCRIPTIONS, "flooder", "more than 10")
        now[0] = LOG_INTERVAL
        refusals.note(Refusal.MESSAGE_RATE, "flooder", "reading paused")
    assert refusals.counts[Refusal.MESSAGE_RATE] == 7
    assert refusals.counts[Refusal.SUBSCRIPTIONS] == 1
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused flooder: message_rate: reading paused",
        "refused other: message_rate: reading paused",
        "refused flooder: subscriptions: more than 10",
        "refused flooder: message_rate: reading paused (4 more in the last minute)",
    ]
