"""Cormorant's Kafka records as Spark columns, decoded by the shared package's own decoders.

Every function here is a vectorized (pandas) UDF around a decoder of
:mod:`services.common.records` (:func:`~services.common.records.decode_meta`,
:func:`~services.common.records.decode_targets`, :func:`~services.common.records.decode_ack`,
:func:`~services.common.records.decode_event`, and
:func:`~services.common.records.split_bundle` for the downlink records that carry a client's
window of stored messages): the byte layouts exist only there. A value
that does not decode gives a row whose ``error`` says why, and nulls elsewhere: the archive
keeps such records instead of failing the job (docs/design.md "Bad input never crashes").

Each UDF takes one binary column (a Kafka header value or the record value; null when
absent) and returns a struct; :data:`META`, :data:`TARGETS`, :data:`ACKS` and :data:`EVENT`
are their Spark schemas. :func:`split_bundle` takes two (the ``b`` header and the value) and
returns :data:`BUNDLE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd
from pyspark.sql import Column
from pyspark.sql.pandas.functions import pandas_udf
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from services.common import records
from services.common.mqtt.errors import MQTTError

_S, _I, _L, _B = StringType(), IntegerType(), LongType(), BooleanType()


def _struct(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, kind) for name, kind in fields])


META = _struct(
    ("error", _S),
    ("topic", _S),
    ("qos", _I),
    ("retain", _B),
    ("received_at_ms", _L),
    ("protocol_version", _I),
    ("message_expiry_interval", _L),
    ("properties_size", _I),
)
TARGETS = _struct(
    ("error", _S),
    ("client_ids", ArrayType(_S)),
    ("qos", ArrayType(_I)),
    ("packet_ids", ArrayType(_I)),
    ("dup", ArrayType(_B)),
)
ACKS = _struct(
    ("error", _S), ("session_id", _S), ("kinds", ArrayType(_S)), ("packet_ids", ArrayType(_I))
)
EVENT = _struct(
    ("error", _S),
    ("kind", _S),
    ("at_ms", _L),
    ("node_id", _S),
    ("client_address", _S),
    ("connection_id", _S),
    ("protocol_version", _I),
    ("reason_code", _I),
    ("cause", _S),
    ("persistent", _B),
    ("clean_start", _B),
    ("session_expiry_interval", _L),
    ("topic_filters", ArrayType(_S)),
    ("filter_qos", ArrayType(_I)),
)

BUNDLE_PART = _struct(("meta", BinaryType()), ("targets", BinaryType()), ("payload_size", _I))
BUNDLE = _struct(("error", _S), ("parts", ArrayType(BUNDLE_PART)))

_DECODE_ERRORS = (records.RecordError, MQTTError, ValueError)


def _meta_row(raw: bytes) -> tuple[Any, ...]:
    meta = records.decode_meta(raw)
    expires = records.expires_at_ms(meta)
    interval = None if expires is None else (expires - meta.received_at_ms) // 1000
    return (
        None,
        meta.topic,
        meta.qos,
        meta.retain,
        meta.received_at_ms,
        meta.protocol_version,
        interval,
        len(meta.properties),
    )


def _targets_row(raw: bytes) -> tuple[Any, ...]:
    targets = records.decode_targets(raw)
    return (
        None,
        [t.client_id for t in targets],
        [t.qos for t in targets],
        [t.packet_id for t in targets],
        [t.dup for t in targets],
    )


def _acks_row(raw: bytes) -> tuple[Any, ...]:
    ack = records.decode_ack(raw)
    return (None, ack.session_id.hex(), [k.name for k, _ in ack.acks], [p for _, p in ack.acks])


def _event_row(raw: bytes) -> tuple[Any, ...]:
    e = records.decode_event(raw)
    return (
        None,
        e.kind.name,
        e.at_ms,
        e.node_id,
        e.client_address,
        e.connection_id.hex(),
        e.protocol_version,
        e.reason_code,
        e.cause.name,
        e.persistent,
        e.clean_start,
        e.session_expiry_interval,
        [f for f, _ in e.topic_filters],
        [q for _, q in e.topic_filters],
    )


def rows(
    decode: Callable[[bytes], tuple[Any, ...]], schema: StructType, values: pd.Series
) -> pd.DataFrame:
    """Apply ``decode`` to each value of ``values`` (bytes or None) and return the frame of
    ``schema``'s columns; a missing or undecodable value gives an ``error`` and nulls."""
    columns = schema.fieldNames()
    blank = (None,) * (len(columns) - 1)
    out: list[tuple[Any, ...]] = []
    for raw in values:
        if raw is None:
            out.append(("missing", *blank))
            continue
        try:
            out.append(decode(bytes(raw)))
        except _DECODE_ERRORS as exc:
            out.append((f"{type(exc).__name__}: {exc}", *blank))
    return pd.DataFrame(out, columns=columns)


def bundle_rows(heads: pd.Series, values: pd.Series) -> pd.DataFrame:
    """Split each bundle record (``heads``: its ``b`` header, ``values``: its value) into
    its messages (:func:`records.split_bundle`) and return the frame of :data:`BUNDLE`'s
    columns: ``parts``, one (``m`` header, encoded targets, payload size in bytes) struct
    per message in order. A null header (a record that is not a bundle) gives null
    ``parts`` and no error; a garbage bundle gives its ``error`` and null ``parts``."""
    out: list[tuple[Any, ...]] = []
    for head, value in zip(heads, values, strict=True):
        if head is None:
            out.append((None, None))
            continue
        try:
            parts = records.split_bundle(bytes(head), b"" if value is None else bytes(value))
        except _DECODE_ERRORS as exc:
            out.append((f"{type(exc).__name__}: {exc}", None))
            continue
        out.append(
            (
                None,
                [
                    {"meta": meta, "targets": targets, "payload_size": len(payload)}
                    for meta, targets, payload, _origin in parts
                ],
            )
        )
    return pd.DataFrame(out, columns=BUNDLE.fieldNames())


def _udf(
    decode: Callable[[bytes], tuple[Any, ...]], schema: StructType
) -> Callable[[Column], Column]:
    def apply(values: pd.Series) -> pd.DataFrame:
        return rows(decode, schema, values)

    apply.__name__ = decode.__name__.strip("_")
    return pandas_udf(apply, schema)  # type: ignore[call-overload,no-any-return]


decode_meta = _udf(_meta_row, META)
"""Column of ``m`` header values → struct of :data:`META` (:class:`records.PublishMeta`)."""

decode_targets = _udf(_targets_row, TARGETS)
"""Column of ``t`` header values → struct of :data:`TARGETS` (:class:`records.Target` list)."""

decode_acks = _udf(_acks_row, ACKS)
"""Column of ``client.acks`` values → struct of :data:`ACKS` (:class:`records.AckRecord`)."""

decode_event = _udf(_event_row, EVENT)
"""Column of ``client.events`` values → struct of :data:`EVENT` (:class:`records.EventRecord`)."""


split_bundle: Callable[[Column, Column], Column] = pandas_udf(  # type: ignore[call-overload]
    bundle_rows, BUNDLE
)
"""Columns of ``b`` header values and record values → struct of :data:`BUNDLE`: a bundle's
messages, undecoded (:func:`records.split_bundle`)."""
