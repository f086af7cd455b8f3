"""Prometheus metrics of every Cormorant service: what they count, and how it is served.

Names follow Prometheus' conventions: the ``cormorant_`` prefix, the unit in the name
(``_seconds``, ``_bytes``, ``_records``), ``_total`` on counters. Every process serves its
own at ``/metrics`` (:mod:`services.common.web`); Prometheus adds ``job`` and ``instance``.

The hot path only adds to plain Python integers: ``MQTT.publish_received[qos] += 1`` costs
what an addition costs, where a ``prometheus_client.Counter`` takes a lock and a label
lookup on every call (bench/NOTES.md, "metrics"). The integers become Prometheus metric
families when Prometheus scrapes (:class:`Collector`); gauges that are read rather than
counted (connections, lag, stored messages) are computed then too, by the ``collect`` and
``refresh`` functions a service registers (:func:`register`, :func:`on_scrape`).

An ingest node's refusals by limit are its :class:`~services.ingest.refusals.Refusals`
counters, read when Prometheus scrapes; CONNECT authentications are counted with
:func:`authentication`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from services.common.mqtt.reason_codes import ReasonCode

CONTENT_TYPE = "text/plain; version=0.0.4"
"""The Prometheus text exposition format's content type (what ``/metrics`` answers; UTF-8)."""

#: Bucket bounds (seconds) of Kafka produce latency: acks=all round trips, 1 ms to 10 s.
PRODUCE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

#: Bucket bounds (seconds) of the router's match time of one message: microseconds.
MATCH_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2)

PROTOCOL_VERSIONS = {3: "3.1", 4: "3.1.1", 5: "5.0"}
"""MQTT's protocol level (CONNECT, MQTT 3.1.2.2) → the version's name, the label value."""


class Histogram:
    """A histogram of plain integers: ``observe`` is a bisect and two additions.

    ``bounds`` are the upper bounds of the buckets (increasing; +Inf is implied), in the
    unit of the observed values. Not thread-safe: one event loop observes it.
    """

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation of ``value``."""
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """How many values were observed."""
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last (Prometheus' histogram shape)."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), total))
        return out


@dataclass
class ListenerCounters:
    """Bytes moved by one kind of MQTT listener (``mqtt``, ``mqtts``, ``ws``, ``wss``)."""

    received_bytes: int = 0
    sent_bytes: int = 0


@dataclass
class MqttCounters:
    """What an ingest node's MQTT connections did, as plain integers.

    ``publish_received[qos]``: PUBLISHes accepted from clients (handed to Kafka);
    ``publish_sent[qos]``: PUBLISHes written to clients; ``connects[(listener, reason)]``:
    CONNECT outcomes by the CONNACK's Reason Code (0 accepted; MQTT 5.0 3.2.2.2, a v3.1.1
    refusal counted under the v5 code it maps from); ``authentications[(method,
    outcome)]``: CONNECT authentications (:func:`authentication`);
    ``backpressure_pauses``: times the node stopped reading from publishers because Kafka
    fell behind; ``session_owner_refusals``: CONNECTs refused because the Client
    Identifier's session belongs to another principal; ``publish_withheld``: messages not
    sent to a subscriber because its rules deny it their topic (a wildcard granted over a
    denied subtree); ``certificate_not_after``: when the TLS listeners' server certificate
    (the leaf of the chain loaded last) stops being valid, Unix seconds (None without a
    TLS listener).
    """

    publish_received: list[int] = field(default_factory=lambda: [0, 0, 0])
    publish_sent: list[int] = field(default_factory=lambda: [0, 0, 0])
    connects: dict[tuple[str, int], int] = field(default_factory=dict)
    authentications: dict[tuple[str, str], int] = field(default_factory=dict)
    listeners: dict[str, ListenerCounters] = field(default_factory=dict)
    backpressure_pauses: int = 0
    session_owner_refusals: int = 0
    publish_withheld: int = 0
    certificate_not_after: float | None = None

    def listener(self, name: str) -> ListenerCounters:
        """The byte counters of listener ``name`` (created at first use)."""
        counters = self.listeners.get(name)
        if counters is None:
            counters = self.listeners[name] = ListenerCounters()
        return counters

    def connect_outcome(self, listener: str, reason_code: int) -> None:
        """Count one CONNECT answered with ``reason_code`` on ``listener``."""
        key = (listener, reason_code)
        self.connects[key] = self.connects.get(key, 0) + 1


@dataclass
class KafkaCounters:
    """Kafka produce latency and failures of this process, by topic (prefix and per-client
    parts of names left out: ``msg.app``, not ``msg.app.<client>``)."""

    produce_latency: dict[str, Histogram] = field(default_factory=dict)
    produce_errors: dict[str, int] = field(default_factory=dict)

    def produced(self, topic: str, seconds: float) -> None:
        """Count one record of ``topic`` (a :func:`topic_label`) acknowledged after
        ``seconds``."""
        histogram = self.produce_latency.get(topic)
        if histogram is None:
            histogram = self.produce_latency[topic] = Histogram(PRODUCE_BUCKETS)
        histogram.observe(seconds)

    def failed(self, topic: str) -> None:
        """Count one record of ``topic`` (a :func:`topic_label`) Kafka did not store."""
        self.produce_errors[topic] = self.produce_errors.get(topic, 0) + 1


class Drop(StrEnum):
    """Why a message was not delivered to a subscriber, or not kept for one: the ``reason``
    label of ``cormorant_messages_dropped_total``.

    ``NO_SUBSCRIBER``: the router found no subscription matching a PUBLISH (MQTT 4.7: the
    message goes to no one; counted per message, not per subscriber). ``EXPIRED``: its
    Message Expiry Interval passed before onward delivery started (MQTT 5.0 3.3.2.3.3,
    [MQTT-3.3.2-5]), at an ingest node or at device_persist. ``QUEUE_FULL``: a connection's
    queue of messages waiting for its in-flight window (Receive Maximum, MQTT 5.0
    3.3.4) was full, so its oldest was dropped. ``STORE_FULL``: the DEVICE store's per-client
    cap (``persisted_max_messages``) dropped a stored message, oldest first.
    ``NOT_AUTHORIZED``: the subscriber's rules deny it the topic at delivery.
    ``TOO_LARGE``: the PUBLISH exceeds the subscriber's Maximum Packet Size (MQTT 5.0
    3.1.2.11.4). ``SESSION_GONE``: a message for a persistent session that ended (or
    became non-persistent) before device_persist could store it.
    """

    NO_SUBSCRIBER = "no_subscriber"
    EXPIRED = "expired"
    QUEUE_FULL = "queue_full"
    STORE_FULL = "store_full"
    NOT_AUTHORIZED = "not_authorized"
    TOO_LARGE = "too_large"
    SESSION_GONE = "session_gone"


MQTT = MqttCounters()
"""This process's MQTT counters (an ingest node's; zero elsewhere and not served)."""

KAFKA = KafkaCounters()
"""This process's Kafka produce counters (every service)."""

DROPPED: dict[Drop, int] = dict.fromkeys(Drop, 0)
"""Messages this process dropped, by :class:`Drop` reason (every reason served, 0 included,
so that ``rate()`` has a series from the first scrape)."""


UNDECODABLE: dict[str, int] = {}
"""Kafka records this process skipped because they did not decode, by topic kind
(:func:`~services.common.kafka.names.kind_of_topic`: ``msg.downlink``, ``client.acks``...)."""


def undecodable(topic_kind: str) -> None:
    """Count one record of ``topic_kind`` skipped as undecodable:
    ``cormorant_kafka_undecodable_records_total``."""
    UNDECODABLE[topic_kind] = UNDECODABLE.get(topic_kind, 0) + 1


def dropped(reason: Drop, count: int = 1) -> None:
    """Count ``count`` messages dropped for ``reason``: ``cormorant_messages_dropped_total``."""
    DROPPED[reason] += count


def authentication(method: str, outcome: str) -> None:
    """Count one CONNECT (or AUTH) authentication by what the client presented,
    ``method`` (``anonymous``, ``password``, ``certificate``, ``scram-sha-256``...), with
    ``outcome`` (``success``, ``challenge``, or the refusal's Reason Code name:
    ``bad_user_name_or_password``, ``not_authorized``...): ``cormorant_auth_attempts_total``."""
    key = (method, outcome)
    MQTT.authentications[key] = MQTT.authentications.get(key, 0) + 1


def reason_name(reason_code: int) -> str:
    """The Reason Code's name in the specification's words, snake case (``0x87`` →
    ``not_authorized``); ``0x00`` of a CONNACK is ``success``."""
    try:
        return ReasonCode(reason_code).name.lower()
    except ValueError:
        return f"reason_{reason_code:#04x}"


Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Scraped metrics: sample name (``cormorant_mqtt_publish_received_total``...) → its
(labels, value) pairs."""


def parse_exposition(text: str) -> Samples:
    """Prometheus' text format → :data:`Samples` (what the admin service and ``cormorant
    status`` read from ``/metrics``). Raises ``ValueError`` on text that is not the format."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        value
        for have, value in samples.get(name, ())
        if all(have.get(key) == wanted for key, wanted in labels.items())
    )


# ------------------------------------------------------------------------ serving them

Collect = Callable[[], Iterable[Metric]]
"""Yields metric families computed when Prometheus scrapes (gauges read from state)."""

Refresh = Callable[[], Awaitable[None]]
"""Brings values up to date before a scrape (asks Kafka or a store); must not raise."""


class Collector:
    """The families of this process that are not ``prometheus_client`` metrics: the
    plain counters above, and what the service registered with :func:`register`."""

    def __init__(self) -> None:
        self.collects: list[Collect] = []

    def collect(self) -> Iterable[Metric]:
        """Every family, as Prometheus' client library asks for them."""
        yield from kafka_families(KAFKA)
        yield dropped_family(DROPPED)
        yield undecodable_family(UNDECODABLE)
        for collect in self.collects:
            yield from collect()


REGISTRY = CollectorRegistry(auto_describe=False)
"""Everything ``/metrics`` serves: the process's CPU, memory and file descriptors, Python's
garbage collector, and the :class:`Collector`."""
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)
_COLLECTOR = Collector()
REGISTRY.register(_COLLECTOR)
_REFRESHES: list[Refresh] = []


def register(collect: Collect) -> None:
    """Serve the families ``collect()`` yields at every scrape."""
    _COLLECTOR.collects.append(collect)


def on_scrape(refresh: Refresh) -> None:
    """Await ``refresh()`` before every scrape (it must catch its own errors)."""
    _REFRESHES.append(refresh)


async def exposition() -> bytes:
    """The Prometheus text exposition of this process, refreshed first."""
    for refresh in _REFRESHES:
        await refresh()
    return generate_latest(REGISTRY)


def info(service: str, version: str, node_id: str | None = None) -> None:
    """Serve ``cormorant_service_info{service, version, node_id}`` 1 and the start time
    (``node_id`` only on an ingest node: no label has an empty value)."""
    started = time.time()
    labels = {"service": service, "version": version}
    if node_id:
        labels["node_id"] = node_id

    def collect() -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "cormorant_service_info",
            "The service this process runs, its version and (ingest) node id.",
            labels=list(labels),
        )
        family.add_metric(list(labels.values()), 1)
        yield family
        yield GaugeMetricFamily(
            "cormorant_service_start_time_seconds",
            "When this process started (Unix time).",
            value=started,
        )

    register(collect)


def histogram_family(
    name: str, documentation: str, histograms: dict[str, Histogram], label: str
) -> HistogramMetricFamily:
    """One histogram family from :class:`Histogram` objects keyed by the value of
    ``label``."""
    family = HistogramMetricFamily(name, documentation, labels=[label])
    for value, histogram in sorted(histograms.items()):
        family.add_metric([value], histogram.buckets(), histogram.sum)
    return family


def kafka_families(counters: KafkaCounters) -> Iterable[Metric]:
    """``cormorant_kafka_produce_latency_seconds`` and ``cormorant_kafka_produce_errors_total``."""
    yield histogram_family(
        "cormorant_kafka_produce_latency_seconds",
        "Time from handing a record to the producer to Kafka's acknowledgement (acks=all).",
        counters.produce_latency,
        "topic",
    )
    errors = CounterMetricFamily(
        "cormorant_kafka_produce_errors",
        "Records Kafka did not store (refused, or not answered in time).",
        labels=["topic"],
    )
    for topic, count in sorted(counters.produce_errors.items()):
        errors.add_metric([topic], count)
    yield errors


def undecodable_family(counts: dict[str, int]) -> Metric:
    """``cormorant_kafka_undecodable_records_total{topic}`` from :data:`UNDECODABLE`."""
    family = CounterMetricFamily(
        "cormorant_kafka_undecodable_records",
        "Kafka records skipped because they did not decode (each logged with its topic, "
        "partition and offset), by topic kind.",
        labels=["topic"],
    )
    for topic, count in sorted(counts.items()):
        family.add_metric([topic], count)
    return family


def dropped_family(counts: dict[Drop, int]) -> Metric:
    """``cormorant_messages_dropped_total{reason}`` from :data:`DROPPED`'s shape."""
    family = CounterMetricFamily(
        "cormorant_messages_dropped",
        "Messages not delivered to a subscriber or not kept for one, by reason (no_subscriber "
        "counts PUBLISHes that matched no subscription; the others one per subscriber).",
        labels=["reason"],
    )
    for reason, count in counts.items():
        family.add_metric([reason.value], count)
    return family


def delayed_families(held: int, waiting: int, ended: Mapping[str, int]) -> Iterable[Metric]:
    """An ingest node's delayed publications (``$delayed/<seconds>/<topic>``): ``held``
    waiting in the ``msg.delayed`` partitions it owns, ``waiting`` in the whole cluster as
    it counts them for ``max_delayed_messages``, ``ended`` those it ended, by outcome
    (``published``, ``cancelled``; both always served, 0 included)."""
    yield GaugeMetricFamily(
        "cormorant_delayed_messages_held",
        "Delayed publications waiting in the msg.delayed partitions this ingest node owns "
        "(kept in its memory, payloads included, until due).",
        value=held,
    )
    yield GaugeMetricFamily(
        "cormorant_delayed_messages_waiting",
        "Delayed publications waiting in the whole cluster, as this node counts them for "
        "max_delayed_messages (every node serves the cluster's count: take the max).",
        value=waiting,
    )
    family = CounterMetricFamily(
        "cormorant_delayed_messages_ended",
        "Delayed publications this ingest node ended, by outcome: published (at their due "
        "time) or cancelled (DELETE /api/delayed/{id}).",
        labels=["outcome"],
    )
    for outcome in ("published", "cancelled"):
        family.add_metric([outcome], ended.get(outcome, 0))
    yield family


def mqtt_families(
    counters: MqttCounters,
    connections: Callable[[], dict[tuple[str, int], int]],
    pending: int,
    refusals: Iterable[tuple[str, int]],
) -> Iterable[Metric]:
    """An ingest node's families: ``connections()`` gives the connected clients by
    (listener, protocol level); ``pending`` the records waiting for Kafka; ``refusals``
    the node's refusals as (limit or failed check, count) pairs (``connections``,
    ``message_rate``, ``tls_handshake``...: :class:`~services.ingest.limits.Refusal`).
    Every listener of ``counters`` has a connections sample for each protocol version,
    0 included, so a node without clients says 0 rather than nothing (a sum over no series
    is no data)."""
    gauge = GaugeMetricFamily(
        "cormorant_mqtt_connections",
        "Connected MQTT clients (CONNACK sent, socket open), by listener and protocol version.",
        labels=["listener", "protocol_version"],
    )
    counts = {(name, level): 0 for name in counters.listeners for level in PROTOCOL_VERSIONS}
    counts |= connections()
    for (listener, level), count in sorted(counts.items()):
        gauge.add_metric([listener, PROTOCOL_VERSIONS.get(level, str(level))], count)
    yield gauge
    connects = CounterMetricFamily(
        "cormorant_mqtt_connects",
        "CONNECTs answered, by listener and CONNACK Reason Code (0x00: accepted).",
        labels=["listener", "reason_code", "reason"],
    )
    for (listener, code), count in sorted(counters.connects.items()):
        connects.add_metric([listener, f"{code:#04x}", reason_name(code)], count)
    yield connects
    for name, values, documentation in (
        ("cormorant_mqtt_publish_received", counters.publish_received,
         "PUBLISH packets accepted from clients, by QoS."),
        ("cormorant_mqtt_publish_sent", counters.publish_sent,
         "PUBLISH packets sent to clients, by QoS."),
    ):  # fmt: skip
        family = CounterMetricFamily(name, documentation, labels=["qos"])
        for qos, count in enumerate(values):
            family.add_metric([str(qos)], count)
        yield family
    yield CounterMetricFamily(
        "cormorant_mqtt_publish_withheld",
        "Messages not sent to a subscriber because its rules deny it their topic.",
        value=counters.publish_withheld,
    )
    received = CounterMetricFamily(
        "cormorant_mqtt_received_bytes", "Bytes read from MQTT sockets.", labels=["listener"]
    )
    sent = CounterMetricFamily(
        "cormorant_mqtt_sent_bytes", "Bytes written to MQTT sockets.", labels=["listener"]
    )
    for listener, moved in sorted(counters.listeners.items()):
        received.add_metric([listener], moved.received_bytes)
        sent.add_metric([listener], moved.sent_bytes)
    yield received
    yield sent
    refused = CounterMetricFamily(
        "cormorant_mqtt_refusals",
        "Connections, packets or reads refused by a limit or a failed handshake, by limit.",
        labels=["limit"],
    )
    for limit, count in sorted(refusals):
        refused.add_metric([limit], count)
    yield refused
    auth = CounterMetricFamily(
        "cormorant_auth_attempts",
        "CONNECT authentications, by method and outcome.",
        labels=["method", "outcome"],
    )
    for (method, outcome), count in sorted(counters.authentications.items()):
        auth.add_metric([method, outcome], count)
    yield auth
    yield CounterMetricFamily(
        "cormorant_mqtt_session_owner_refusals",
        "CONNECTs refused (0x87 Not authorized) because the Client Identifier's session "
        "belongs to another principal (credential, or anonymous).",
        value=counters.session_owner_refusals,
    )
    yield CounterMetricFamily(
        "cormorant_ingest_backpressure_pauses",
        "Times the node stopped reading from publishers while records waited for Kafka.",
        value=counters.backpressure_pauses,
    )
    yield GaugeMetricFamily(
        "cormorant_ingest_pending_records",
        "Records waiting to be sent to Kafka or for its acknowledgement.",
        value=pending,
    )
    if counters.certificate_not_after is not None:
        yield GaugeMetricFamily(
            "cormorant_tls_certificate_expiry_timestamp_seconds",
            "When the mqtts/wss listeners' server certificate expires (its notAfter, Unix "
            "time), as loaded at start or by the last successful reload (SIGHUP).",
            value=counters.certificate_not_after,
        )
