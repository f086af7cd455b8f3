"""The ingest node's backpressure against the real broker: past
``ingest_max_pending_records`` records waiting for Kafka it stops reading from a publishing
client, and reads again once they are answered, with nothing lost."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from services.common.auth.authenticate import Authenticator, NoCredentials
from services.common.auth.authorize import ALLOW_ALL_RULE
from services.common.kafka.admin import core_topic_specs, ensure_topics
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import Connect, Publish
from services.common.records import Headers, KafkaRecord
from services.common.sessions import new_connection_id
from services.common.settings import Settings
from services.ingest.connection import ServerConnection
from services.ingest.node import IngestNode
from tests.waiting import wait_for

pytestmark = pytest.mark.kafka

TIMEOUT = 20.0
LIMIT = 5
MESSAGES = 40


class SocketShell:
    """The transport side of one client as the node sees it: what was written, and whether
    reading is paused (every pause and resume in order)."""

    def __init__(self, node: IngestNode) -> None:
        self.connection = ServerConnection(node.context, new_connection_id())
        self.written: list[bytes] = []
        self.reading: list[bool] = [True]

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.reading.append(False)

    def pause_reading(self) -> None:
        self.reading.append(False)

    def resume_reading(self) -> None:
        self.reading.append(True)

    def keep_alive_changed(self) -> None:
        return None

    def write_buffer_size(self) -> int:
        return 0


async def _count_records(bootstrap: str, topic: str, expected: int) -> int:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        seen = 0
        deadline = asyncio.get_running_loop().time() + TIMEOUT
        while seen < expected and asyncio.get_running_loop().time() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            seen += sum(len(records) for records in batches.values())
        return seen
    finally:
        await consumer.stop()


async def test_a_flood_pauses_reading_until_kafka_answers(
    kafka_bootstrap: str, settings: Settings
) -> None:
    own = settings.model_copy(
        update={
            "topic_prefix": f"bp{uuid.uuid4().hex[:6]}.",
            "ingest_max_pending_records": LIMIT,
        }
    )
    await ensure_topics(kafka_bootstrap, core_topic_specs(own))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()

    async def send(
        topic: str, key: bytes, value: bytes | None, headers: Headers | None
    ) -> Awaitable[object]:
        return await producer.send(topic, value, key=key, headers=headers)

    async def synced() -> None:
        return None

    async def no_app_topics(client_id: str) -> None:
        raise AssertionError(f"{client_id} is not an APPLICATION client")

    async def no_wills(partition: int, records: list[KafkaRecord]) -> None:
        raise AssertionError("the flooder has no Will Message nor delayed message")

    try:
        node = IngestNode(
            own,
            send,
            synced,
            no_app_topics,
            authenticator=Authenticator(
                NoCredentials(), allow_anonymous=True, anonymous_rules=(ALLOW_ALL_RULE,)
            ),
            fetch_credential=NoCredentials().get,
            commit_will=no_wills,
            commit_delayed=no_wills,
        )
        shell = SocketShell(node)
        node.run(shell, shell.connection.receive_data(encode(Connect(4, "flooder", True, 60), 4)))
        await wait_for(lambda: shell.written, "CONNACK", TIMEOUT)

        flood = b"".join(encode(Publish("flood/x", str(i).encode()), 4) for i in range(MESSAGES))
        node.run(shell, shell.connection.receive_data(flood))
        assert shell.reading[-1] is False, "reading goes on past the limit"
        assert node.pending_records == MESSAGES

        await wait_for(lambda: node.pending_records == 0, "Kafka's answers", TIMEOUT)
        assert shell.reading == [True, False, True]
        stored = await _count_records(kafka_bootstrap, node.names.msg_all, MESSAGES)
        assert stored == MESSAGES
    finally:
        await producer.stop()
