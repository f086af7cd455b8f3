"""The 2 ms retry after CONCURRENT_TRANSACTIONS (services/common/kafka/consumer.py) reaches
aiokafka: its sender must still read the module constant we set, or an aiokafka upgrade would
silently bring the 20 ms wait back."""

from __future__ import annotations

import inspect

import aiokafka.producer.sender as aiokafka_sender

from services.common.kafka import consumer


def test_aiokafkas_sender_reads_the_retry_we_set() -> None:
    assert aiokafka_sender.BACKOFF_OVERRIDE == consumer.CONCURRENT_TRANSACTIONS_RETRY_SECONDS
    assert "return BACKOFF_OVERRIDE" in inspect.getsource(aiokafka_sender)
