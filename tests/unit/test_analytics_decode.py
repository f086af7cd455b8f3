"""The archive's decoders (spark_emr/decode.py) on the values a pandas UDF receives: the
shared package's formats decode to columns, garbage and missing headers to an error row."""

from __future__ import annotations

import pandas as pd

from services.common import records
from services.common.kafka.names import TopicNames
from services.common.mqtt.packets import PacketType
from services.common.mqtt.properties import Properties, encode_properties
from spark_emr import decode


def test_publish_meta_decodes_to_columns_with_the_message_expiry_interval() -> None:
    props = Properties()
    props.message_expiry_interval = 30
    meta = records.PublishMeta(
        "a/b", 2, True, 1_700_000_000_000, 5, encode_properties(props, PacketType.PUBLISH)
    )
    frame = decode.rows(decode._meta_row, decode.META, pd.Series([records.encode_meta(meta)]))
    row = frame.iloc[0].to_dict()
    assert row["error"] is None
    assert (row["topic"], row["qos"], row["retain"], row["protocol_version"]) == ("a/b", 2, True, 5)
    assert (row["received_at_ms"], row["message_expiry_interval"]) == (1_700_000_000_000, 30)


def test_garbage_and_missing_values_become_error_rows() -> None:
    frame = decode.rows(decode._meta_row, decode.META, pd.Series([b"\x01\x07", None]))
    assert list(frame["error"].str.split(":").str[0]) == ["RecordError", "missing"]
    assert frame["topic"].isna().all()
    assert list(frame.columns) == decode.META.fieldNames()


def test_targets_acks_and_events_decode() -> None:
    targets = records.encode_targets(
        [records.Target("s1", 1, packet_id=7), records.Target("s2", 0)]
    )
    frame = decode.rows(decode._targets_row, decode.TARGETS, pd.Series([targets]))
    assert frame.iloc[0]["client_ids"] == ["s1", "s2"]
    assert frame.iloc[0]["packet_ids"] == [7, 0]
    ack = records.encode_ack(records.AckRecord(bytes(16), [(records.AckKind.PUBACK, 7)]))
    frame = decode.rows(decode._acks_row, decode.ACKS, pd.Series([ack]))
    assert (frame.iloc[0]["kinds"], frame.iloc[0]["packet_ids"]) == (["PUBACK"], [7])
    event = records.EventRecord(
        records.EventKind.SUBSCRIBED, 5, "node1", "1.2.3.4:5", topic_filters=(("a/#", 1),)
    )
    frame = decode.rows(decode._event_row, decode.EVENT, pd.Series([records.encode_event(event)]))
    row = frame.iloc[0]
    assert (row["kind"], row["client_address"], row["topic_filters"], row["filter_qos"]) == (
        "SUBSCRIBED",
        "1.2.3.4:5",
        ["a/#"],
        [1],
    )


def test_a_bundle_splits_into_its_messages_and_garbage_into_an_error() -> None:
    meta = records.encode_meta(records.PublishMeta("a/b", 1, False, 5, 5))
    window = [
        (meta, b"one", records.Target("s1", 1, packet_id=7)),
        (meta, b"three", records.Target("s1", 1, packet_id=8)),
    ]
    bundle = records.downlink_bundle_record(TopicNames(), "n1", "s1", window)
    [(_, head)] = bundle.headers
    frame = decode.bundle_rows(
        pd.Series([head, head[:-1], None]), pd.Series([bundle.value, bundle.value, b"x"])
    )
    assert list(frame.columns) == decode.BUNDLE.fieldNames()
    good, garbage, other = frame.itertuples(index=False)
    assert good.error is None
    assert [(p["meta"], p["payload_size"]) for p in good.parts] == [(meta, 3), (meta, 5)]
    targets = decode.rows(
        decode._targets_row, decode.TARGETS, pd.Series([p["targets"] for p in good.parts])
    )
    assert list(targets["packet_ids"]) == [[7], [8]]
    assert (garbage.error, garbage.parts) == (
        "RecordError: bundle header does not match its message count",
        None,
    )
    assert (other.error, other.parts) == (None, None)  # not a bundle: its headers are read
