"""The services over secured connections, as in AWS: Kafka SASL_SSL/SCRAM-SHA-512 (MSK's port
9096), Redis over TLS with a password (ElastiCache's auth token), PostgreSQL over TLS with
``sslmode=verify-full`` and a password (RDS).

One secured local cluster for the whole module, started through the launcher
(services/local/) with a certificate authority made by the test: Kafka, Redis, PostgreSQL,
one ingest node, the router, device_persist (Redis store), app_delivery and HAProxy. The
data path runs through it: an MQTT PUBLISH reaches a persistent subscriber through
ingest → msg.all → router → msg.persisted → device_persist (Redis) → downlink → ingest,
online and after the subscriber was away. PostgreSQL is exercised by its message store's
round trips. Wrong credentials, a wrong CA and plain connections are refused.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import aiomqtt
import boto3
import psycopg
import pytest
from aiokafka.errors import KafkaError
from moto import mock_aws
from psycopg import sql
from pydantic import SecretStr

from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.security import client_security
from services.common.stores import MessageStore, StoreError, StoreUnavailable, open_store
from services.local import cluster as local_cluster
from services.local import ports
from services.local.settings import LocalSettings
from tests.e2e.clients import HOST, TIMEOUT, collect, unique
from tests.pki import make_pki
from tests.servers import LocalCluster
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]


@pytest.fixture(scope="module")
def secured(
    settings: LocalSettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalSettings]:
    """The secured cluster, up; its settings (what the services were given)."""
    base = tmp_path_factory.mktemp("secured")
    pki = make_pki(base / "pki")
    # The session's block was chosen with these free too, at the session's start.
    slot = ports.SECURED
    block = ports.SESSION.block(settings)
    taken = [p for p in ports.listening_ports(slot.settings(block)) if not ports.bindable(p)]
    assert not taken, f"ports of the secured test cluster are taken: {taken}"
    value = LocalSettings(
        **{
            **settings.model_dump(exclude={"kafka_bootstrap", "redis_url", "postgres_dsn"}),
            **slot.ports(block),
            "state_dir": base / "state",
            "ingest_nodes": slot.ingest_nodes,
            "kafka_security_protocol": "SASL_SSL",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": "cormorant",
            "kafka_sasl_password": SecretStr(secrets.token_urlsafe(24)),
            "kafka_ssl_cafile": pki.ca,
            "redis_password": SecretStr(secrets.token_urlsafe(24)),
            "redis_ssl_cafile": pki.ca,
            "postgres_password": SecretStr(secrets.token_urlsafe(24)),
            "postgres_sslmode": "verify-full",
            "postgres_sslrootcert": pki.ca,
            "local_tls_cert_file": pki.cert,
            "local_tls_key_file": pki.key,
        }
    )
    try:
        local_cluster.up(value)
        yield local_cluster.local_settings(value)
    finally:
        local_cluster.down(value)


def _persistent(port: int, client_id: str) -> aiomqtt.Client:
    """An MQTT 3.1.1 client with a persistent session (Clean Session 0): a DEVICE whose
    messages device_persist stores in Redis."""
    return aiomqtt.Client(
        HOST,
        port,
        identifier=client_id,
        protocol=aiomqtt.ProtocolVersion.V311,
        clean_session=False,
        timeout=TIMEOUT,
    )


async def test_mqtt_data_path_through_secured_kafka_and_redis(secured: LocalSettings) -> None:
    port = LocalCluster(secured).mqtt_port
    topic = unique("secured/sensors")
    subscriber = unique("secured-sub")
    async with _persistent(port, subscriber) as client:
        await client.subscribe(topic, qos=1)
        async with _persistent(port, unique("secured-pub")) as publisher:
            await publisher.publish(topic, b"while online", qos=1)
        [message] = await collect(client, 1)
        assert message.payload == b"while online"
    # Away: the message waits in Redis (over TLS, behind AUTH) until the subscriber is back.
    async with _persistent(port, unique("secured-pub")) as publisher:
        await publisher.publish(topic, b"while away", qos=1)
    async with _persistent(port, subscriber) as client:
        [message] = await collect(client, 1)
        if message.payload == b"while online":
            # A redelivery: its PUBACK may not have reached device_persist before the
            # disconnect, and an unacknowledged QoS 1 message comes again (DUP set).
            [message] = await collect(client, 1)
        assert (message.topic.value, message.payload) == (topic, b"while away")


async def test_redis_store_refuses_a_client_without_the_password(secured: LocalSettings) -> None:
    good = open_store(secured)
    await good.append("secured-store", 1, 1, 2**52, b"data")
    assert [m.data for m in await good.window("secured-store", 10, 0)] == [b"data"]
    await good.close()

    anonymous = open_store(secured.model_copy(update={"redis_password": None}))
    with pytest.raises(StoreError, match="Authentication required"):
        await anonymous.window("secured-store", 10, 0)
    await anonymous.close()
    plain_url = secured.redis_url.replace("rediss://", "redis://")
    plain = open_store(secured.model_copy(update={"redis_url": plain_url}))
    with pytest.raises(StoreUnavailable):
        await plain.window("secured-store", 10, 0)
    await plain.close()


async def test_postgres_store_over_verified_tls(secured: LocalSettings) -> None:
    postgres = secured.model_copy(update={"store_backend": "postgres"})
    store = open_store(postgres)
    await store.append("secured-pg", 7, 1, 2**52, b"stored over TLS")
    assert [m.data for m in await store.window("secured-pg", 10, 0)] == [b"stored over TLS"]
    await store.close()


@pytest.mark.parametrize("wrong", ["certificate authority", "password", "no TLS"])
async def test_postgres_refuses_a_wrong_ca_password_or_plain_client(
    secured: LocalSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture, wrong: str
) -> None:
    change, reason = {
        # libpq's message for a chain signed by another key
        "certificate authority": (
            {"postgres_sslrootcert": make_pki(tmp_path / "other").ca},
            "SSL error",
        ),
        "password": ({"postgres_password": SecretStr("wrong")}, "password authentication failed"),
        "no TLS": ({"postgres_sslmode": "disable"}, "no pg_hba.conf entry .* no encryption"),
    }[wrong]
    update = {"store_backend": "postgres", "store_timeout_seconds": 3.0, **change}
    refused = open_store(secured.model_copy(update=update))
    # The pool keeps retrying in the background; the store gives up after its timeout, and
    # the pool's log says why (services/common/stores/postgres_store.py).
    with caplog.at_level("WARNING", logger="psycopg.pool"), pytest.raises(StoreUnavailable):
        await refused.window("secured-pg", 10, 0)
    await refused.close()
    assert re.search(reason, caplog.text), caplog.text


def _login(password: SecretStr) -> str:
    """An RDS-managed secret's JSON."""
    return json.dumps({"username": "cormorant", "password": password.get_secret_value()})


async def _stored(store: MessageStore) -> bool:
    try:
        return [m.data for m in await store.window("rotation", 10, 0)] == [b"before"]
    except StoreUnavailable:
        return False


async def test_postgres_store_logs_in_again_after_the_password_rotates(
    secured: LocalSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RDS rotates its managed password every 7 days. A store reading it from Secrets
    Manager (``postgres_password_secret_arn``, moto here) opens its new connections with
    the new one; a store given the password at start cannot."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert secured.postgres_password is not None
    old, new = secured.postgres_password, SecretStr(secrets.token_urlsafe(24))
    base = {"store_backend": "postgres", "store_timeout_seconds": 3.0}
    with mock_aws():
        manager = boto3.client("secretsmanager", region_name="eu-west-1")
        arn = manager.create_secret(Name="rds!db-rotation", SecretString=_login(old))["ARN"]
        reading = open_store(
            secured.model_copy(
                update={**base, "postgres_password": None, "postgres_password_secret_arn": arn}
            )
        )
        fixed = open_store(secured.model_copy(update=base))
        await reading.append("rotation", 1, 1, 2**52, b"before")
        assert await _stored(fixed)
        role = await psycopg.AsyncConnection.connect(
            secured.postgres_dsn,
            password=old.get_secret_value(),
            sslmode=secured.postgres_sslmode,
            sslrootcert=str(secured.postgres_sslrootcert),
            autocommit=True,
        )
        change = "ALTER ROLE CURRENT_USER PASSWORD {}"
        try:
            # What RDS does: the server's password and the secret change together...
            await role.execute(sql.SQL(change).format(sql.Literal(new.get_secret_value())))
            manager.put_secret_value(SecretId=arn, SecretString=_login(new))
            # ...and every connection opened before ends sooner or later (here: now).
            await role.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE usename = current_user AND pid <> pg_backend_pid()"
            )
            await wait_for(lambda: _stored(reading), "a connection with the new password")
            assert not await _stored(fixed)
        finally:
            await role.execute(sql.SQL(change).format(sql.Literal(old.get_secret_value())))
            await role.close()
            await reading.close()
            await fixed.close()


async def test_kafka_topic_administration_over_sasl_ssl(secured: LocalSettings) -> None:
    topic = [TopicSpec(f"{secured.topic_prefix}secured-{secrets.token_hex(4)}", 1)]
    created = await ensure_topics(secured.kafka_bootstrap, topic, security=client_security(secured))
    assert created == [topic[0].name]


@pytest.mark.parametrize("wrong", ["password", "certificate authority", "plaintext"])
async def test_kafka_refuses_a_wrong_login_ca_or_plain_client(
    secured: LocalSettings, tmp_path: Path, wrong: str
) -> None:
    change: dict[str, object] = {
        "password": {"kafka_sasl_password": SecretStr("wrong")},
        "certificate authority": {"kafka_ssl_cafile": make_pki(tmp_path / "other").ca},
        "plaintext": {"kafka_security_protocol": "PLAINTEXT"},
    }[wrong]
    security = client_security(secured.model_copy(update=change))
    topic = [TopicSpec(f"{secured.topic_prefix}refused-{secrets.token_hex(4)}", 1)]
    with pytest.raises(KafkaError):
        await ensure_topics(secured.kafka_bootstrap, topic, security=security)
