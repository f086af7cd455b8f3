"""Scenarios: from a name and a few options to the exact clients of one run.

A ``Plan`` lists every subscriber (filter, QoS, which publishers it should hear from) and
every publisher (topic, QoS, payload size, rate); ``Plan.share`` deals them to workers.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, replace

from bench.loadgen.transports import TRANSPORTS, Endpoint

SCENARIOS: tuple[str, ...] = (
    "p2p",
    "fan-in",
    "fan-in-app",
    "fan-out",
    "fan-out-tbmq",
    "persistent-p2p",
    "connections",
)

#: Not an MQTT scenario: the two Kafka hops of a p2p message with nothing else
#: (:mod:`bench.kafka_floor`); also the ``broker`` of its result records.
KAFKA_FLOOR = "kafka-floor"

#: QoS 1 PUBLISHes a publisher keeps awaiting PUBACK, unless ``--inflight`` says otherwise.
DEFAULT_INFLIGHT = 64


@dataclass(frozen=True, slots=True)
class SubscriberSpec:
    """One subscribing client: ``expected`` are the publisher ids its filter matches;
    ``application``: the broker must treat it as an APPLICATION client (fan-in-app)."""

    client_id: str
    topic_filter: str
    qos: int
    clean: bool
    expected: tuple[int, ...]
    application: bool = False


@dataclass(frozen=True, slots=True)
class PublisherSpec:
    """One publishing client; ``publisher_id`` goes into every payload.

    ``rate`` is in messages per second for this publisher; 0 means as fast as the in-flight
    window (QoS 1) or the socket (QoS 0) allows.
    """

    publisher_id: int
    client_id: str
    topic: str
    qos: int
    size: int
    rate: float
    clean: bool


@dataclass(frozen=True, slots=True)
class Timing:
    """Phase lengths, in seconds."""

    warmup: float = 3.0
    duration: float = 10.0
    drain: float = 10.0
    setup: float = 30.0  # connect + SUBACK, and again for the route probe
    hold: float = 2.0  # connections scenario: how long the idle connections stay open


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a run does; picklable, so a share of it is a worker's whole brief."""

    scenario: str
    label: str
    host: str
    port: int
    version: int  # MQTT Protocol Level: 4 (3.1.1) or 5 (5.0)
    inflight: int  # per QoS 1 publisher: PUBLISHes awaiting their PUBACK
    keep_alive: int  # seconds
    timing: Timing
    subscribers: tuple[SubscriberSpec, ...] = ()
    publishers: tuple[PublisherSpec, ...] = ()
    connections: int = 0  # connections scenario: idle clients to open
    username: str | None = None  # every client's CONNECT User Name and Password, if set
    password: str | None = None
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    transport: str = "tcp"  # one of transports.TRANSPORTS
    ca_file: str = ""  # tls / wss: the CA certificate (PEM) that signed the broker's

    @property
    def endpoint(self) -> Endpoint:
        """Where and how every client of the plan connects."""
        return Endpoint(self.host, self.port, self.transport, self.ca_file)

    def share(self, worker: int, workers: int) -> Plan:
        """The clients of worker ``worker`` of ``workers`` (round robin over each list)."""
        per_worker, extra = divmod(self.connections, workers)
        return replace(
            self,
            subscribers=self.subscribers[worker::workers],
            publishers=self.publishers[worker::workers],
            connections=per_worker + (1 if worker < extra else 0),
        )


@dataclass(frozen=True, slots=True)
class Options:
    """Scenario options from the command line; None means the scenario's default."""

    pairs: int | None = None
    publishers: int | None = None
    subscribers: int | None = None
    qos: int | None = None
    size: int | None = None
    rate: float | None = None  # total msg/s over all publishers; None: unpaced
    connections: int | None = None
    version: int = 4
    inflight: int = DEFAULT_INFLIGHT
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    transport: str = "tcp"  # one of transports.TRANSPORTS
    ca_file: str = ""  # tls / wss: the CA certificate (PEM) that signed the broker's


def build(scenario: str, options: Options, timing: Timing) -> Plan:
    """The plan of ``scenario`` with ``options``.

    Raises:
        ValueError: an unknown scenario or an option out of range.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
    if options.version not in (4, 5):
        raise ValueError(f"MQTT version must be 4 (3.1.1) or 5 (5.0), got {options.version}")
    default_qos = 0 if scenario == "fan-out-tbmq" else 1
    qos = default_qos if options.qos is None else options.qos
    if qos not in (0, 1):
        raise ValueError(f"QoS must be 0 or 1, got {qos}")
    label = scenario
    if (options.qos is not None and qos != default_qos) or scenario in ("fan-in", "fan-in-app"):
        label += f"-qos{qos}"
    if options.rate is not None and scenario != "fan-out-tbmq":
        label += f"-rate{options.rate:g}"
    if options.version == 5:
        label += "-v5"
    if options.username is not None:
        label += "-auth"
    if options.transport not in TRANSPORTS:
        raise ValueError(
            f"unknown transport {options.transport!r}; choose one of {', '.join(TRANSPORTS)}"
        )
    if options.transport != "tcp":
        label += f"-{options.transport}"
    run_id = secrets.token_hex(3)
    base = Plan(
        scenario=scenario,
        label=label,
        host=options.host,
        port=options.port,
        version=options.version,
        inflight=options.inflight,
        keep_alive=60,
        timing=timing,
        username=options.username,
        password=options.password,
        run_id=run_id,
        transport=options.transport,
        ca_file=options.ca_file,
    )
    prefix = f"bench/{run_id}"
    cid = f"cb-{run_id}"

    def pick(value: int | None, default: int) -> int:
        chosen = default if value is None else value
        if chosen < 1:
            raise ValueError(f"client and connection counts must be at least 1, got {chosen}")
        return chosen

    if scenario == "connections":
        return replace(base, connections=pick(options.connections, 1000))

    if scenario in ("p2p", "persistent-p2p"):
        pairs = pick(options.pairs, 10)
        clean = scenario == "p2p"
        size = options.size or (64 if clean else 62)
        rate = (options.rate or 0.0) / pairs
        subs = tuple(
            SubscriberSpec(f"{cid}-s{i}", f"{prefix}/p2p/{i}", qos, clean, (i,))
            for i in range(pairs)
        )
        pubs = tuple(
            PublisherSpec(i, f"{cid}-p{i}", f"{prefix}/p2p/{i}", qos, size, rate, clean)
            for i in range(pairs)
        )
        label = base.label
        if options.inflight != DEFAULT_INFLIGHT:
            # The bounded in-flight scenario (``--pairs 50 --inflight 10``: at most 500
            # messages in flight system-wide, as real QoS 1 clients keep): its own label.
            label += f"-inflight{pairs * options.inflight}"
        return replace(base, label=label, subscribers=subs, publishers=pubs)

    if scenario in ("fan-in", "fan-in-app"):
        n_pub = pick(options.publishers, 20)
        n_sub = pick(options.subscribers, 1)
        everyone = tuple(range(n_pub))
        rate = (options.rate or 0.0) / n_pub
        # fan-in-app: persistent APPLICATION subscribers (TBMQ's fan-in clients); their ids
        # start with "app-", which the broker's application_client_ids must match.
        app = scenario == "fan-in-app"
        sub_id = f"app-{cid}" if app else cid
        subs = tuple(
            SubscriberSpec(f"{sub_id}-s{i}", f"{prefix}/in/+", qos, not app, everyone, app)
            for i in range(n_sub)
        )
        pubs = tuple(
            PublisherSpec(i, f"{cid}-p{i}", f"{prefix}/in/{i}", qos, options.size or 64, rate, True)
            for i in range(n_pub)
        )
        return replace(base, subscribers=subs, publishers=pubs)

    if scenario == "fan-out":
        n_pub = pick(options.publishers, 1)
        n_sub = pick(options.subscribers, 50)
        rate = (options.rate or 0.0) / n_pub
        subs = tuple(
            SubscriberSpec(f"{cid}-s{i}", f"{prefix}/out", qos, True, tuple(range(n_pub)))
            for i in range(n_sub)
        )
        pubs = tuple(
            PublisherSpec(i, f"{cid}-p{i}", f"{prefix}/out", qos, options.size or 64, rate, True)
            for i in range(n_pub)
        )
        return replace(base, subscribers=subs, publishers=pubs)

    # fan-out-tbmq: TBMQ's shape, 100 publishers at 10 msg/s each, subscribers on '#'.
    n_pub = pick(options.publishers, 100)
    n_sub = pick(options.subscribers, 10)
    rate = (options.rate or 10.0 * n_pub) / n_pub
    everyone = tuple(range(n_pub))
    subs = tuple(SubscriberSpec(f"{cid}-s{i}", "#", qos, True, everyone) for i in range(n_sub))
    pubs = tuple(
        PublisherSpec(i, f"{cid}-p{i}", f"{prefix}/tbmq/{i}", qos, options.size or 66, rate, True)
        for i in range(n_pub)
    )
    return replace(base, subscribers=subs, publishers=pubs)
