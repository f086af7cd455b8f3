"""The analytics over real traffic: MQTT clients publish through the test cluster (HAProxy,
ingest nodes, Kafka), the archive job copies Kafka to Parquet, the report job counts.

- the archive holds exactly what was published (count, topics, payloads, QoS, retain,
  protocol versions, client ids), and the connects/disconnects with their causes;
- a second run adds nothing, a run after more traffic adds exactly that traffic;
- the report's numbers equal counts computed here, from what was published or (for the
  tables over all of the session's traffic) from the Parquet files read with pyarrow;
- a missing or empty topic, or an empty archive, gives a clear result, not an error.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as pads
import pytest
import sqlglot
from aiokafka import AIOKafkaConsumer
from click.testing import CliRunner
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from services.cli import main
from services.common.kafka.admin import TopicSpec, ensure_topics
from services.common.kafka.consumer import assign_whole_topics
from services.common.kafka.names import TopicNames
from services.common.records import (
    EventKind,
    PublishMeta,
    Target,
    decode_ack,
    decode_event,
    downlink_bundle_record,
    encode_meta,
)
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from spark_emr.athena import QUERIES
from spark_emr.jobs import archive, report
from spark_emr.kafka_admin import KafkaUnreachable
from spark_emr.kafka_options import kafka_options
from spark_emr.render import render
from spark_emr.topics import archive_topics
from tests.e2e.clients import TIMEOUT, PahoClient, RawSocket, session_connect_packet, unique
from tests.servers import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.kafka]


@dataclass
class Published:
    """What the test's clients published: one (client id, topic, payload, QoS, retain,
    protocol version) per message, and the connections' expected end causes."""

    root: str
    messages: list[tuple[str, str, bytes, int, bool, int]] = field(default_factory=list)
    ends: dict[str, tuple[str, int]] = field(default_factory=dict)

    def clients(self) -> set[str]:
        return {m[0] for m in self.messages} | set(self.ends)


def _publish(
    cluster: LocalCluster,
    client_id: str,
    version: int,
    messages: list[tuple[str, bytes, int, bool]],
    published: Published,
) -> PahoClient:
    """Connect ``client_id`` and publish ``messages``; return once all QoS 1/2 ones are
    acknowledged (a QoS 1 message closes each batch, so the QoS 0 ones before it are stored)."""
    client = PahoClient(cluster.mqtt_port, client_id, version=version)
    assert client.connect() == 0
    mids = []
    for topic, payload, qos, retain in messages:
        info = client.client.publish(topic, payload, qos, retain=retain)
        mids.append((info.mid, qos))
        published.messages.append((client_id, topic, payload, qos, retain, version))
    deadline = time.monotonic() + TIMEOUT
    while any(qos and mid not in client.snapshot()[0] for mid, qos in mids):
        assert time.monotonic() < deadline, f"{client_id}: not every PUBLISH was acknowledged"
        time.sleep(0.02)  # polling pace of a condition with a deadline
    return client


def _traffic(cluster: LocalCluster, published: Published) -> None:
    """Publishers of both protocol versions and every QoS, and connections that end in
    each way the events tell apart; a persistent subscriber (a DEVICE: its messages go
    through device_persist) receives and acknowledges the QoS 2 ones."""
    root = published.root
    dash = PahoClient(
        cluster.mqtt_port, f"{root}-dash", version=5, clean_start=False, session_expiry=300
    )
    assert dash.connect() == 0
    assert dash.subscribe(f"{root}/room2", 1)[0].value == 1
    a = _publish(
        cluster,
        f"{root}-a",
        5,
        [
            *[(f"{root}/room1/temp", b"t" * i, 0, False) for i in range(5)],
            (f"{root}/room1/temp", b"21.5", 1, False),
        ],
        published,
    )
    b = _publish(
        cluster,
        f"{root}-b",
        4,
        [(f"{root}/room1/hum", b"0123456789", 1, i == 0) for i in range(4)],
        published,
    )
    c = _publish(
        cluster,
        f"{root}-c",
        5,
        [(f"{root}/room2", bytes(100), 2, False) for _ in range(3)],
        published,
    )
    for _ in range(3):
        dash.messages.get(timeout=TIMEOUT)  # paho acknowledges each (PUBACK)
    dash.disconnect(0)
    a.disconnect(0)
    b.close()  # v3.1.1 DISCONNECT
    c.disconnect(0x04)  # Disconnect with Will Message
    published.ends |= {
        f"{root}-a": ("CLIENT_DISCONNECT", 0),
        f"{root}-b": ("CLIENT_DISCONNECT", 0),
        f"{root}-c": ("CLIENT_DISCONNECT", 4),
        f"{root}-dash": ("CLIENT_DISCONNECT", 0),
    }
    with RawSocket(cluster.mqtt_port) as lost:
        lost.send(session_connect_packet(f"{root}-lost", level=4, clean_start=True))
        assert lost.read_packet()[0] >> 4 == 2  # CONNACK, then the socket just goes
    published.ends[f"{root}-lost"] = ("CONNECTION_LOST", 0)
    with RawSocket(cluster.mqtt_port) as silent:
        silent.send(
            session_connect_packet(f"{root}-silent", level=5, clean_start=True, keep_alive=1)
        )
        assert silent.read_packet()[0] >> 4 == 2
        silent.read_until_closed()  # closed after 1.5 times the Keep Alive of silence
    published.ends[f"{root}-silent"] = ("KEEP_ALIVE_TIMEOUT", 0x8D)
    first = PahoClient(cluster.mqtt_port, f"{root}-twin")
    assert first.connect() == 0
    second = PahoClient(cluster.mqtt_port, f"{root}-twin")
    assert second.connect() == 0
    deadline = time.monotonic() + TIMEOUT
    while not first.snapshot()[1]:
        assert time.monotonic() < deadline, "the first connection was not taken over"
        time.sleep(0.02)  # polling pace of a condition with a deadline
    second.disconnect(0)
    # The twin's two connections: taken over, then a normal DISCONNECT (checked by cause).
    published.ends[f"{root}-twin"] = ("TAKEOVER", 0x8E)


RECORDS_TIMEOUT = 60.0
"""Seconds to wait for the event and acknowledgement records: written off the hot path, the
first ones of a freshly started cluster on a loaded machine can lag the clients by long."""


async def _in_kafka(
    cluster: LocalCluster, topic: str, count: Callable[[Any], int], wanted: int
) -> None:
    """Wait until the records of ``topic`` add up to ``wanted`` by ``count`` (a record's
    share), from the topic's start: events and acknowledgements are written by the ingest
    nodes without the client waiting for them."""
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap, group_id=None)
    await consumer.start()
    seen = 0
    try:
        async with asyncio.timeout(RECORDS_TIMEOUT):
            await assign_whole_topics(consumer, [topic], from_end=False)
            while seen < wanted:
                batch = await consumer.getmany(timeout_ms=200)
                seen += sum(count(record) for records in batch.values() for record in records)
    except TimeoutError:
        raise AssertionError(f"{topic}: {seen} of {wanted} records") from None
    finally:
        await consumer.stop()


def _written(cluster: LocalCluster, published: Published) -> None:
    """Wait for the DISCONNECTED events of every connection and the subscriber's PUBACKs."""
    names = TopicNames.from_settings(cluster.settings)
    clients = {key.encode() for key in published.ends}
    dash = f"{published.root}-dash".encode()

    def disconnects(record: Any) -> int:
        if record.key not in clients:
            return 0
        return int(decode_event(record.value).kind is EventKind.DISCONNECTED)

    def pubacks(record: Any) -> int:
        return len(decode_ack(record.value).acks) if record.key == dash else 0

    asyncio.run(_in_kafka(cluster, names.client_events, disconnects, len(clients) + 1))
    asyncio.run(_in_kafka(cluster, names.client_acks, pubacks, 3))


def _topics(cluster: LocalCluster) -> archive.ArchiveTopics:
    return archive_topics(TopicNames.from_settings(cluster.settings))


def _mine(spark: SparkSession, where: Path, published: Published) -> pd.DataFrame:
    table = archive.read_table(spark, str(where), "messages")
    assert table is not None
    return (
        table.where(table.client_id.isin(sorted(published.clients())))
        .drop("date", "hour")
        .toPandas()
    )


@pytest.fixture(scope="module")
def archived(
    settings: LocalSettings, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """Traffic made, then archived once: the published messages, the archive directory,
    the first run's results and the time range around it all."""
    if not all(row.healthy for row in local_cluster.status(settings)):
        local_cluster.up(settings)
    cluster = LocalCluster(settings)
    started = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=5)
    published = Published(unique("an"))
    _traffic(cluster, published)
    _written(cluster, published)
    where = tmp_path_factory.mktemp("archive")
    options = kafka_options(cluster.kafka_bootstrap)
    results = archive.run(spark, str(where), _topics(cluster), options, progress=lambda _: None)
    return {
        "published": published,
        "where": where,
        "results": results,
        "started": started,
        "options": options,
    }


def test_the_archive_holds_exactly_what_was_published(
    cluster: LocalCluster, spark: SparkSession, archived: dict[str, Any]
) -> None:
    published: Published = archived["published"]
    rows = _mine(spark, archived["where"], published)
    assert rows["record_error"].isna().all()
    got = Counter(
        (r.client_id, r.topic, bytes(r.payload), r.qos, r.retain, r.protocol_version)
        for r in rows.itertuples()
    )
    assert got == Counter(published.messages)
    assert (rows["payload_size"] == rows["payload"].map(len)).all()
    assert (rows["kafka_topic"] == TopicNames.from_settings(cluster.settings).msg_all).all()
    assert archived["results"]["messages"].rows >= len(published.messages)


def test_events_tell_each_connection_and_how_it_ended(
    spark: SparkSession, archived: dict[str, Any]
) -> None:
    published: Published = archived["published"]
    table = archive.read_table(spark, str(archived["where"]), "events")
    assert table is not None
    events = pd.DataFrame(table.where(table.client_id.isin(sorted(published.clients()))).toPandas())
    connects = events[events["kind"] == "CONNECTED"]
    ends = events[events["kind"] == "DISCONNECTED"]
    assert Counter(connects["client_id"]) == Counter(
        {client: 2 if client.endswith("-twin") else 1 for client in published.ends}
    )
    # Every disconnect answers a connect of the same network connection.
    assert set(ends["connection_id"]) == set(connects["connection_id"])
    causes = {(r.client_id, r.cause, r.reason_code) for r in ends.itertuples()}
    expected = {(client, cause, code) for client, (cause, code) in published.ends.items()}
    twin = f"{published.root}-twin"
    assert causes == expected | {(twin, "CLIENT_DISCONNECT", 0)}
    subscribed = events[events["kind"] == "SUBSCRIBED"]
    assert [
        (r.client_id, list(r.topic_filters), list(r.filter_qos)) for r in subscribed.itertuples()
    ] == [(f"{published.root}-dash", [f"{published.root}/room2"], [1])]
    assert set(connects["protocol_version"]) == {4, 5}
    assert connects["client_address"].str.match(r"^127\.0\.0\.1:\d+$").all()
    assert connects["node_id"].str.startswith("node").all()


def test_a_second_run_adds_nothing_and_a_later_one_adds_exactly_the_new_traffic(
    cluster: LocalCluster, spark: SparkSession, archived: dict[str, Any]
) -> None:
    published: Published = archived["published"]
    where, topics, options = archived["where"], _topics(cluster), archived["options"]
    before = _mine(spark, where, published)
    archive.run(spark, str(where), topics, options, progress=lambda _: None)
    assert len(_mine(spark, where, published)) == len(before)

    more = Published(published.root)
    d = _publish(
        cluster,
        f"{published.root}-d",
        5,
        [(f"{published.root}/room3", f"m{i}".encode(), 1, False) for i in range(7)],
        more,
    )
    d.close()
    archive.run(spark, str(where), topics, options, progress=lambda _: None)
    after = _mine(spark, where, _merged(published, more))
    assert len(after) == len(before) + 7
    new = after[after["client_id"] == f"{published.root}-d"]
    assert sorted(bytes(p) for p in new["payload"]) == sorted(m[2] for m in more.messages)
    table = archive.read_table(spark, str(where), "messages")
    assert table is not None
    keys = table.select("kafka_topic", "kafka_partition", "kafka_offset")
    assert keys.count() == keys.distinct().count()  # no record archived twice
    published.messages += more.messages


def _merged(a: Published, b: Published) -> Published:
    return Published(a.root, a.messages + b.messages, a.ends | b.ends)


def _parquet(directory: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet directory read with pyarrow (not Spark): the independent side of a check."""
    return (
        pads.dataset(directory, format="parquet", partitioning="hive")
        .to_table(columns=columns)
        .to_pandas()
    )


def test_report_numbers_equal_counts_computed_independently(
    spark: SparkSession, archived: dict[str, Any], tmp_path: Path
) -> None:
    published: Published = archived["published"]
    root = published.root
    since = archived["started"]
    until = datetime.now(UTC).replace(tzinfo=None) + timedelta(minutes=1)
    out = tmp_path / "report"
    summary = report.run(
        spark,
        str(archived["where"]),
        str(out),
        report.ReportOptions(since, until),
        progress=lambda _: None,
    )

    levels = _parquet(out / "tables" / "traffic_by_topic_level")
    mine = levels[levels["topic_prefix"].str.startswith(root)]
    expected: Counter[tuple[int, str]] = Counter()
    size: Counter[tuple[int, str]] = Counter()
    for _, topic, payload, *_ in published.messages:
        parts = topic.split("/")
        for level in range(1, len(parts) + 1):
            expected[(level, "/".join(parts[:level]))] += 1
            size[(level, "/".join(parts[:level]))] += len(payload)
    assert {(r.level, r.topic_prefix): r.messages for r in mine.itertuples()} == expected
    assert {(r.level, r.topic_prefix): r.bytes for r in mine.itertuples()} == size

    clients = _parquet(out / "tables" / "traffic_by_client")
    per_client = Counter(m[0] for m in published.messages)
    got = clients[clients["client_id"].isin(per_client)]
    assert dict(zip(got["client_id"], got["messages"], strict=True)) == per_client

    # Tables over all traffic in the range: counted from the archive's files with pyarrow.
    messages = _parquet(
        archived["where"] / "messages",
        ["received_at", "qos", "retain", "payload_size", "record_error"],
    )
    messages = messages[
        messages["record_error"].isna()
        & (messages["received_at"] >= since)
        & (messages["received_at"] < until)
    ]
    assert summary.messages == len(messages)
    assert summary.bytes == messages["payload_size"].sum()
    qos = _parquet(out / "tables" / "qos_mix")
    assert dict(zip(qos["qos"], qos["messages"], strict=True)) == dict(Counter(messages["qos"]))
    retained = _parquet(out / "tables" / "retained_share")
    assert dict(zip(retained["retain"], retained["messages"], strict=True)) == dict(
        Counter(messages["retain"])
    )
    events = _parquet(
        archived["where"] / "events", ["at", "kind", "cause", "reason_code", "record_error"]
    )
    events = events[
        events["record_error"].isna() & (events["at"] >= since) & (events["at"] < until)
    ]
    ends = events[events["kind"] == "DISCONNECTED"]
    reasons = _parquet(out / "tables" / "disconnect_reasons")
    assert {(r.cause, r.reason_code): r.disconnects for r in reasons.itertuples()} == dict(
        Counter(zip(ends["cause"], ends["reason_code"], strict=True))
    )
    assert summary.connects == (events["kind"] == "CONNECTED").sum()
    assert set(reasons["reason"].dropna()) >= {"KEEP_ALIVE_TIMEOUT", "SESSION_TAKEN_OVER"}

    backlog = _parquet(out / "tables" / "stored_backlog")
    dash = backlog[backlog["client_id"] == f"{root}-dash"]
    assert dash[["stored", "acknowledged", "backlog"]].values.tolist() == [[3, 3, 0]]
    # device_persist sends the dashboard's stored messages as bundle records (a window
    # each): the archive holds one delivery per message, its Packet Identifier with it.
    sent = _parquet(
        archived["where"] / "deliveries",
        ["stage", "target_client_ids", "target_packet_ids", "payload_size", "record_error"],
    )
    sent = sent[
        (sent["stage"] == "downlink")
        & sent["target_client_ids"].map(lambda ids: ids is not None and f"{root}-dash" in ids)
    ]
    assert sent["record_error"].isna().all()
    assert sorted(len(ids) for ids in sent["target_packet_ids"]) == [1, 1, 1]
    assert all(ids[0] > 0 for ids in sent["target_packet_ids"])
    assert list(sent["payload_size"]) == [100, 100, 100]
    acks = _parquet(archived["where"] / "acks", ["client_id", "kind", "acked_at"])
    latency = _parquet(out / "tables" / "latency").set_index("stage")
    acked = acks[acks["kind"].isin(["PUBACK", "PUBCOMP"]) & (acks["acked_at"] >= since)]
    assert latency.loc["acknowledged", "messages"] == len(acked)
    assert latency.loc["acknowledged", "p50_ms"] >= latency.loc["sent from store", "p50_ms"]
    assert "routed to persisted" in latency.index

    _athena_answers_as_the_report(spark, archived["where"], report.ReportOptions(since, until), out)

    index = render(out)
    page = index.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') >= 8
    assert "http://" not in page and "https://" not in page  # nothing fetched at view time
    assert json.loads((out / "summary.json").read_text())["messages"] == summary.messages


_TIMES = {"messages": "received_at", "events": "at", "deliveries": "routed_at", "acks": "acked_at"}


def _athena(spark: SparkSession, name: str, views: dict[str, str], having: bool = True) -> Any:
    """Saved Athena query ``name`` run by Spark SQL: parsed as Trino's dialect, its archive
    tables pointed at ``views`` (table → temporary view), written as Spark's dialect by
    sqlglot (``having``: False drops the HAVING clause); a pandas frame."""
    query = next(q for q in QUERIES if q.name == name)
    tree = sqlglot.parse_one(query.for_database("athena"), read="trino")
    for table in list(tree.find_all(sqlglot.exp.Table)):
        if table.db == "athena":
            table.replace(sqlglot.exp.to_table(views[table.name]))
    if not having:
        tree.set("having", None)
    return spark.sql(tree.sql("spark")).toPandas()


def _athena_answers_as_the_report(
    spark: SparkSession, where: Path, options: report.ReportOptions, out: Path
) -> None:
    """The saved Athena queries, run by Spark over the archive's rows of the report's range
    (each table by its own time, as the report limits them), answer what the report wrote
    in ``<out>/tables`` for the same questions."""
    assert options.since is not None and options.until is not None
    views: dict[str, str] = {}
    before: dict[str, str] = {}
    for name, column in _TIMES.items():
        table = archive.read_table(spark, str(where), name)
        assert table is not None
        ended = table.where(F.col(column) < F.lit(options.until))
        views[name] = before[name] = f"athena_{name}_{unique('v').replace('-', '_')}"
        ended.where(F.col(column) >= F.lit(options.since)).createOrReplaceTempView(views[name])
        before[name] += "_all"
        ended.createOrReplaceTempView(before[name])

    levels = _parquet(out / "tables" / "traffic_by_topic_level")
    first = levels[levels["level"] == 1]
    want = {r.topic_prefix: (r.messages, r.bytes) for r in first.itertuples()}
    got = _athena(spark, "traffic-by-topic-level", views)
    assert len(got) == min(100, len(want))
    assert {r.topic_level_1: (r.messages, r.bytes) for r in got.itertuples()}.items() <= (
        want.items()
    )

    mix = _athena(spark, "qos-mix", views)
    qos = _parquet(out / "tables" / "qos_mix")
    assert mix.groupby("qos")["messages"].sum().to_dict() == dict(
        zip(qos["qos"], qos["messages"], strict=True)
    )
    retained = _parquet(out / "tables" / "retained_share")
    assert mix.groupby("retain")["messages"].sum().to_dict() == dict(
        zip(retained["retain"], retained["messages"], strict=True)
    )

    fleet = _athena(spark, "fleet-activity", views)
    summary = json.loads((out / "summary.json").read_text())
    assert fleet["connects"].sum() == summary["connects"]
    reasons = _parquet(out / "tables" / "disconnect_reasons")
    assert fleet["disconnects"].sum() == reasons["disconnects"].sum()

    # Reconnects: the report looks back before the range for each connect's previous event.
    # Compared from the range's first whole minute (the report counts connects from since).
    start = pd.Timestamp(options.since).floor("min")
    storms = _parquet(out / "tables" / "reconnects_by_minute")
    storms = storms[storms["minute"] > start]
    minutes = _athena(spark, "reconnect-storms", before, having=False)
    minutes = minutes[minutes["minute"] > start]
    columns = ["minute", "connects", "reconnects"]
    assert minutes[columns].values.tolist() == storms[columns].values.tolist()
    flagged = _athena(spark, "reconnect-storms", before)
    assert set(flagged[flagged["minute"] > start]["minute"]) == set(
        storms[storms["storm"]]["minute"]
    )

    latency = _athena(spark, "delivery-latency", views).set_index("stage")
    table = _parquet(out / "tables" / "latency").set_index("stage")
    table = table.drop(index="acknowledged", errors="ignore")
    assert latency["messages"].to_dict() == table["messages"].to_dict()
    for column in ("p50_ms", "p90_ms", "p99_ms"):
        # Athena counts whole milliseconds, the report microseconds.
        assert ((latency[column] - table[column]).abs() < 1).all(), (latency, table)

    auth = _athena(spark, "auth-failures", views)
    failures = _parquet(out / "tables" / "auth_failures")
    assert sorted(map(tuple, auth[["client_host", "failures", "client_ids"]].values)) == sorted(
        map(tuple, failures[["client_host", "failures", "client_ids"]].values)
    )

    backlog = _athena(spark, "stored-backlog", views)
    stored = _parquet(out / "tables" / "stored_backlog")
    want_backlog = {r.client_id: (r.stored, r.acknowledged, r.backlog) for r in stored.itertuples()}
    assert len(backlog) == min(100, len(want_backlog))
    assert {
        r.client_id: (r.stored, r.acknowledged, r.backlog) for r in backlog.itertuples()
    }.items() <= want_backlog.items()


#: The Kafka source's columns (Spark's Kafka integration guide), for records made by hand.
_KAFKA_ROW = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
)


def test_a_bundle_record_is_one_delivery_per_message_and_a_garbage_one_an_error_row(
    spark: SparkSession,
) -> None:
    names = TopicNames()
    meta = encode_meta(PublishMeta("x/y", 1, False, 1_700_000_000_000, 5))
    window = [
        (meta, b"one", Target("s", 1, packet_id=7)),
        (meta, b"three", Target("s", 1, packet_id=8)),
    ]
    bundle = downlink_bundle_record(names, "n1", "s", window)
    [(_, head)] = bundle.headers
    at = datetime(2026, 11, 27, 12)
    kafka = spark.createDataFrame(
        [
            (bundle.key, bundle.value, bundle.topic, 0, 1, at, 0, [("b", head)]),
            (bundle.key, bundle.value, bundle.topic, 0, 2, at, 0, [("b", head[:-1])]),
        ],
        _KAFKA_ROW,
    )
    rows = pd.DataFrame(archive.deliveries(archive_topics(names))(kafka).toPandas())
    got = sorted(
        (r.kafka_offset, r.stage, r.topic, r.payload_size, list(r.target_packet_ids))
        for r in rows.itertuples()
        if r.record_error is None
    )
    assert got == [(1, "downlink", "x/y", 3, [7]), (1, "downlink", "x/y", 5, [8])]
    errors = rows[rows["record_error"].notna()]
    assert errors[["kafka_offset", "record_error"]].values.tolist() == [
        [2, "RecordError: bundle header does not match its message count"]
    ]


def test_a_missing_or_empty_topic_and_an_empty_archive_give_clear_results(
    cluster: LocalCluster, spark: SparkSession, tmp_path: Path
) -> None:
    names = TopicNames.from_settings(cluster.settings)
    empty = names.prefix + unique("empty")
    asyncio.run(ensure_topics(cluster.kafka_bootstrap, [TopicSpec(empty, 1)]))
    topics = archive.ArchiveTopics(
        names.prefix + unique("no-such"), empty, empty, empty, "x.", "y.", "z."
    )
    lines: list[str] = []
    results = archive.run(
        spark,
        str(tmp_path / "archive"),
        topics,
        kafka_options(cluster.kafka_bootstrap),
        only=("messages", "events"),
        progress=lines.append,
    )
    assert (results["messages"].rows, results["messages"].note) == (
        0,
        f"topic {topics.msg_all} does not exist",
    )
    assert (results["events"].rows, results["events"].note) == (0, "no new records")
    assert any("does not exist" in line for line in lines)

    summary = report.run(
        spark,
        str(tmp_path / "archive"),
        str(tmp_path / "report"),
        report.ReportOptions(),
        progress=lambda _: None,
    )
    assert summary.messages == 0
    assert summary.notes[0].startswith("no messages archived")
    page = render(tmp_path / "report").read_text(encoding="utf-8")
    assert "no messages archived" in page and "no data in this range" in page


def test_an_unreachable_kafka_is_one_clear_error(spark: SparkSession, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(KafkaUnreachable, match=r"Kafka at 127\.0\.0\.1:1 did not list its topics"):
        archive.run(
            spark,
            str(tmp_path),
            _topics_for_prefix("x."),
            kafka_options("127.0.0.1:1"),
            list_timeout=2,
        )
    assert time.monotonic() - started < 30
    assert not (tmp_path / "messages").exists()


def _topics_for_prefix(prefix: str) -> archive.ArchiveTopics:
    return archive_topics(TopicNames(prefix))


def test_the_commands_print_what_they_did(
    cluster: LocalCluster,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spark: SparkSession,
    archived: dict[str, Any],
) -> None:
    monkeypatch.setenv("CORMORANT_KAFKA_BOOTSTRAP", cluster.kafka_bootstrap)
    monkeypatch.setenv("CORMORANT_TOPIC_PREFIX", cluster.settings.topic_prefix)
    monkeypatch.setenv("CORMORANT_CACHE_DIR", str(cluster.settings.cache_dir))
    # The module's archive, brought up to date: one new message makes a micro-batch to tell.
    root = archived["published"].root
    _publish(cluster, f"{root}-cli", 5, [(f"{root}/cli", b"c", 1, False)], Published(root)).close()
    where = archived["where"]
    result = CliRunner().invoke(main, ["analytics", "archive", "--archive", str(where)])
    assert result.exit_code == 0, result.output
    # Kafka records read, not rows written (an acknowledgement record is many acks rows).
    assert "TABLE            RECORDS  NOTE" in result.output
    assert "records archived in" in result.output
    assert re.search(r"^messages   batch \d+: ", result.output, re.M), result.output
    out = tmp_path / "report"
    since = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")
    result = CliRunner().invoke(
        main, ["analytics", "report", "--archive", str(where), "--since", since, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "traffic_by_topic_level" in result.output
    assert f"report: {out / 'index.html'}" in result.output
    result = CliRunner().invoke(
        main, ["analytics", "report", "--since", "yesterday", "--out", str(out)]
    )
    assert result.exit_code == 2 and "not an ISO 8601 date" in result.output


def test_a_report_reads_only_the_partitions_of_its_range(
    spark: SparkSession, archived: dict[str, Any]
) -> None:
    table = archive.read_table(spark, str(archived["where"]), "messages")
    assert table is not None
    since: datetime = archived["started"]
    options = report.ReportOptions(since, since + timedelta(hours=2))
    frame = report.in_range(table, "received_at", options)
    plan = frame._jdf.queryExecution().executedPlan().toString()
    scan = next(line for line in plan.splitlines() if "FileScan parquet" in line)
    # Spark shortens long lists in the plan with "...", closing bracket included.
    filters = re.search(r"PartitionFilters: \[(.*?), PushedFilters", scan)
    assert filters is not None and "date#" in filters[1] and "hour#" in filters[1], scan
    until = options.until
    assert until is not None
    assert (
        frame.count()
        == table.where((table.received_at >= since) & (table.received_at < until)).count()
    )
    # A range before any archived data: pruned by its dates as well, and empty.
    earlier = report.ReportOptions(since - timedelta(days=3), since - timedelta(days=2))
    before = report.in_range(table, "received_at", earlier)
    assert "PartitionFilters: [" in before._jdf.queryExecution().executedPlan().toString()
    assert before.count() == 0
