"""A durability harness: QoS 1 publishers at a fixed total rate, one persistent subscriber.

What it answers, after any disruption of the broker: was every acknowledged message
delivered (MQTT 4.3.2: a PUBACK means the broker owns the message), how many deliveries were
duplicates (allowed at QoS 1, counted), and did any message of a publisher reach the
subscriber after a newer one of the same publisher (MQTT 4.6: ordered topics)?

The clients are paho-mqtt's (a third-party client, as an independent user's harness would
be), each on its own network thread with paho's own reconnection: a publisher keeps its
unacknowledged messages and sends them again, in order and with DUP=1, after it reconnects
(MQTT 4.4); the subscriber has a persistent session (Clean Session 0 / a Session Expiry
Interval) and so gets what was stored for it while it was away. Publisher ``i`` publishes to
``<prefix>/<i>``; the subscriber subscribes to ``<prefix>/#`` at QoS 1. The payload carries
the publisher's index and a sequence number (``bench.loadgen.payload``); sequence numbers
start at 1, 0 marks the route probes sent before the measured traffic.

:class:`Ledger` is the pure accounting (unit-tested); :class:`DurabilityLoad` drives the
clients. Times are ``time.monotonic()`` seconds of this process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from bench.loadgen import payload

#: Seconds a client may take to connect, or the route probes to arrive.
SETUP_TIMEOUT = 30.0

#: Session Expiry Interval of the v5 clients (seconds): their sessions outlive any outage.
SESSION_EXPIRY = 3600

#: At most this many examples of each anomaly are kept in a report.
EXAMPLES = 10

#: paho's state of a QoS 1 message it has yet to send (again) on the current connection.
_PAHO_TO_SEND = paho.mqtt_ms_publish


@dataclass(frozen=True, slots=True)
class Report:
    """What a run came to. Counts are of messages (publisher, sequence number) unless said.

    ``published``: handed to the clients; ``acknowledged``: a successful PUBACK came;
    ``refused``: a PUBACK with a failure Reason Code came (MQTT 5); ``delivered``: distinct
    messages the subscriber got; ``lost``: acknowledged and never delivered;
    ``duplicates``: deliveries of a message already delivered; ``reordered``: first
    deliveries of a message after a newer one of the same publisher. ``lost_examples`` and
    ``reordered_examples``: a few (publisher, sequence number) pairs.
    """

    published: int
    acknowledged: int
    refused: int
    delivered: int
    lost: int
    duplicates: int
    reordered: int
    lost_examples: list[tuple[int, int]]
    reordered_examples: list[tuple[int, int]]


@dataclass
class Ledger:
    """The accounting of one run: what each publisher sent and had acknowledged, and what the
    subscriber got, in arrival order. Safe to feed from several threads (one lock)."""

    sent_at: dict[tuple[int, int], float] = field(default_factory=dict)
    acked_at: dict[tuple[int, int], float] = field(default_factory=dict)
    refused: set[tuple[int, int]] = field(default_factory=set)
    deliveries: list[tuple[int, int, float]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def published(self, publisher: int, seq: int, at: float) -> None:
        """Publisher ``publisher`` handed message ``seq`` to its client at ``at``."""
        with self._lock:
            self.sent_at[(publisher, seq)] = at

    def acknowledged(self, publisher: int, seq: int, at: float, ok: bool) -> None:
        """A PUBACK came for the message at ``at``; ``ok`` False: a failure Reason Code."""
        with self._lock:
            if ok:
                self.acked_at[(publisher, seq)] = at
                self.refused.discard((publisher, seq))
            elif (publisher, seq) not in self.acked_at:
                self.refused.add((publisher, seq))

    def delivered(self, publisher: int, seq: int, at: float) -> None:
        """The subscriber got the message at ``at``."""
        with self._lock:
            self.deliveries.append((publisher, seq, at))

    def missing(self) -> int:
        """Acknowledged messages not delivered yet."""
        with self._lock:
            got = {(p, s) for p, s, _ in self.deliveries}
            return sum(1 for key in self.acked_at if key not in got)

    def awaited_markers(self) -> dict[int, int]:
        """The ordering markers not delivered yet: publisher → sequence number of its newest
        acknowledged message, for each publisher whose newest acknowledged message the
        subscriber has not got.

        Once a publisher's marker has come, each of its acknowledged messages that has not
        is lost for good: a later message of the same publisher arrived without it, and
        MQTT 4.6 (ordered topics) lets none come after a newer one. Until it has come, a
        missing message may be late, not lost.
        """
        with self._lock:
            newest: dict[int, int] = {}
            for p, s in self.acked_at:
                newest[p] = max(newest.get(p, 0), s)
            got = {(p, s) for p, s, _ in self.deliveries}
            return {p: s for p, s in newest.items() if (p, s) not in got}

    def delivery_count(self) -> int:
        """Deliveries so far, duplicates included: grows while anything still arrives."""
        with self._lock:
            return len(self.deliveries)

    def drain(self, quiet: float, poll: float = 0.1) -> int:
        """Wait until every publisher's ordering marker (:meth:`awaited_markers`) has been
        delivered, or until nothing at all has been delivered for ``quiet`` seconds; return
        the acknowledged messages not delivered then (:meth:`missing`): lost.

        A message is decided lost by order, not by a fixed deadline: either a later one of
        its publisher arrived without it, or the subscriber got nothing more for ``quiet``
        seconds while that publisher's marker was still due. A slow machine whose backlog
        still flows makes a slow drain, not a false loss; a real loss ends the wait as soon
        as the markers are in, not at a deadline.
        """
        count = self.delivery_count()
        progress = time.monotonic()
        while self.awaited_markers():
            now = time.monotonic()
            if (latest := self.delivery_count()) != count:
                count, progress = latest, now
            elif now - progress > quiet:
                break
            time.sleep(poll)
        return self.missing()

    def resumed_at(self, since: float) -> float | None:
        """When the first message published at or after ``since`` was delivered (None: none
        yet). Looks only at the deliveries since ``since``: cheap to poll."""
        with self._lock:
            first = None
            for p, s, at in reversed(self.deliveries):
                if at < since:
                    break
                if self.sent_at.get((p, s), -1.0) >= since:
                    first = at
            return first

    def delivery_timeline(self) -> list[tuple[float, float]]:
        """``(sent_at, delivered_at)`` of every first delivery: for :mod:`bench.resumption`."""
        with self._lock:
            seen: set[tuple[int, int]] = set()
            out = []
            for p, s, at in self.deliveries:
                if (p, s) not in seen and (p, s) in self.sent_at:
                    seen.add((p, s))
                    out.append((self.sent_at[(p, s)], at))
            return out

    def ack_timelines(self) -> dict[int, list[tuple[float, float]]]:
        """Per publisher, ``(sent_at, acked_at)`` of its acknowledged messages."""
        with self._lock:
            out: dict[int, list[tuple[float, float]]] = {}
            for (p, s), at in self.acked_at.items():
                out.setdefault(p, []).append((self.sent_at.get((p, s), at), at))
            return out

    def report(self, since: float | None = None, until: float | None = None) -> Report:
        """The counts as they stand: of every message, or with ``since`` / ``until``
        (monotonic seconds) of the messages published in ``[since, until)`` alone (a chaos
        round's share; a message is reordered when it came after a newer one of its
        publisher, whenever that one was published)."""

        def counted(key: tuple[int, int]) -> bool:
            at = self.sent_at.get(key)
            if at is None:
                return since is None and until is None
            return (since is None or at >= since) and (until is None or at < until)

        with self._lock:
            seen: set[tuple[int, int]] = set()
            newest: dict[int, int] = {}
            duplicates = 0
            reordered: list[tuple[int, int]] = []
            for p, s, _ in self.deliveries:
                if (p, s) in seen:
                    duplicates += counted((p, s))
                    continue
                seen.add((p, s))
                if s < newest.get(p, 0) and counted((p, s)):
                    reordered.append((p, s))
                newest[p] = max(newest.get(p, 0), s)
            lost = sorted(key for key in self.acked_at if key not in seen and counted(key))
            return Report(
                published=sum(1 for key in self.sent_at if counted(key)),
                acknowledged=sum(1 for key in self.acked_at if counted(key)),
                refused=sum(1 for key in self.refused if counted(key)),
                delivered=sum(1 for key in seen if counted(key)),
                lost=len(lost),
                duplicates=duplicates,
                reordered=len(reordered),
                lost_examples=lost[:EXAMPLES],
                reordered_examples=reordered[:EXAMPLES],
            )


def _client(client_id: str, version: int) -> paho.Client:
    """A paho client with a persistent session that reconnects by itself, quickly."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
        clean_session=None if version == 5 else False,
    )
    client.reconnect_delay_set(min_delay=1, max_delay=2)
    # Sent in order, many in flight: what a busy device does (paho queues the rest).
    client.max_inflight_messages_set(100)
    client.max_queued_messages_set(0)
    return client


def _connect(client: paho.Client, host: str, port: int, version: int, clean: bool) -> None:
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 0 if clean else SESSION_EXPIRY
        client.connect(host, port, keepalive=30, clean_start=clean, properties=props)
    else:
        client.connect(host, port, keepalive=30)


class _Publisher:
    """One publishing client: numbers its messages and resolves PUBACKs to them."""

    def __init__(self, load: DurabilityLoad, index: int) -> None:
        self.load = load
        self.index = index
        self.topic = f"{load.prefix}/{index}"
        self.client = _client(f"{load.prefix}-pub-{index}", load.version)
        self.client.on_publish = self._on_publish
        self.seq = 0
        self._mids: dict[int, int] = {}  # paho message id → sequence number
        self._acks: deque[tuple[int, bool, float]] = deque()  # (mid, ok, at), unresolved
        self._lock = threading.Lock()
        self._padding = payload.padding(load.size)

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        # Called on paho's thread, possibly before publish() has returned the mid: noted
        # here, matched to its sequence number by resolve() on the publishing thread.
        self._acks.append((mid, not rc.is_failure, time.monotonic()))

    def publish(self, seq: int) -> None:
        """Send message ``seq`` (0: a probe) and note it in the ledger."""
        now = time.monotonic()
        data = payload.HEADER.pack(self.index, seq, time.time_ns()) + self._padding
        info = self.client.publish(self.topic, data, qos=1)
        with self._lock:
            self._mids[info.mid] = seq
        if seq:
            self.load.ledger.published(self.index, seq, now)
        self.resolve()

    def next(self) -> None:
        """Send the next measured message."""
        self.seq += 1
        self.publish(self.seq)

    def can_send(self) -> bool:
        """Whether a new message would go out after every older one.

        Not while disconnected, nor while paho still has messages of the previous connection
        to send again: paho sends a new PUBLISH at once as soon as its socket is open, before
        the CONNACK that makes it re-send the older ones, which would put the new message
        ahead of them (a reordering by the client, not the broker). A device holds its new
        messages meanwhile; so does this harness. Reads paho's queue (``_out_messages``),
        which paho has no public view of.
        """
        client = self.client
        if not client.is_connected():
            return False
        with client._out_message_mutex:
            return all(m.state != _PAHO_TO_SEND for m in client._out_messages.values())

    def resolve(self) -> None:
        """Match the PUBACKs that came to their messages (paho reuses a message id only
        65,535 publications later, long after)."""
        while self._acks:
            mid, ok, at = self._acks[0]
            with self._lock:
                seq = self._mids.get(mid)
                if seq is None:
                    return  # publish() has not returned this mid yet
                # A refused message is final too: paho does not send it again.
                del self._mids[mid]
            self._acks.popleft()
            if seq:
                self.load.ledger.acknowledged(self.index, seq, at, ok)

    def pending(self) -> int:
        """Messages sent and not acknowledged yet."""
        self.resolve()
        with self._lock:
            return len(self._mids)


class DurabilityLoad:
    """``publishers`` QoS 1 publishers sending ``rate`` msg/s in all, and one persistent
    subscriber, against the MQTT broker at ``host:port`` (MQTT ``version`` 4 = 3.1.1 or 5;
    ``size``: payload bytes). Use as a context manager, or :meth:`start` then :meth:`close`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        publishers: int = 20,
        rate: float = 500.0,
        size: int = 64,
        version: int = 4,
        prefix: str | None = None,
    ) -> None:
        if publishers < 1 or rate <= 0:
            raise ValueError("need at least one publisher and a positive rate")
        self.host, self.port, self.version, self.size = host, port, version, size
        self.rate = rate
        self.prefix = prefix or f"durability-{uuid.uuid4().hex[:8]}"
        self.ledger = Ledger()
        self.publishers = [_Publisher(self, i) for i in range(publishers)]
        self.subscriber = _client(f"{self.prefix}-sub", version)
        self.subscriber.on_message = self._on_message
        self._probes: set[int] = set()
        self._subscribed = threading.Event()
        self.subscriber.on_subscribe = lambda *_: self._subscribed.set()
        self.subscriber.on_connect = self._on_subscriber_connect
        self._stop = threading.Event()
        self._pacer: threading.Thread | None = None

    def __enter__(self) -> DurabilityLoad:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- subscriber

    def _on_subscriber_connect(
        self, client: paho.Client, _u: object, flags: object, rc: ReasonCode, _p: object
    ) -> None:
        if not rc.is_failure and not self._subscribed.is_set():
            client.subscribe(f"{self.prefix}/#", qos=1)

    def _on_message(self, _c: object, _u: object, message: paho.MQTTMessage) -> None:
        index, seq, _sent_ns = payload.decode(message.payload)
        if seq == payload.PROBE_SEQ:
            self._probes.add(index)
        else:
            self.ledger.delivered(index, seq, time.monotonic())

    # ----------------------------------------------------------------- life cycle

    def start(self) -> None:
        """Connect everyone, check every publisher's route with a probe, start publishing.

        Raises ``TimeoutError`` when the subscription or the probes do not come within
        ``SETUP_TIMEOUT`` seconds, ``OSError`` when the broker cannot be reached.
        """
        _connect(self.subscriber, self.host, self.port, self.version, clean=False)
        self.subscriber.loop_start()
        _wait(self._subscribed.is_set, SETUP_TIMEOUT, "the subscription")
        for publisher in self.publishers:
            _connect(publisher.client, self.host, self.port, self.version, clean=False)
            publisher.client.loop_start()
        deadline = time.monotonic() + SETUP_TIMEOUT
        while len(self._probes) < len(self.publishers):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"route probes of {len(self._probes)} of {len(self.publishers)} "
                    "publishers arrived"
                )
            for publisher in self.publishers:
                if publisher.index not in self._probes:
                    publisher.publish(payload.PROBE_SEQ)
            _wait(lambda: len(self._probes) == len(self.publishers), 1.0, "", quiet=True)
        self._pacer = threading.Thread(target=self._pace, name="durability-pacer", daemon=True)
        self._pacer.start()

    def _pace(self) -> None:
        """Publish at ``rate`` msg/s in all, an equal share per publisher, until stopped; a
        publisher that cannot send (:meth:`_Publisher.can_send`) sends what it owes later."""
        started = time.monotonic()
        share = self.rate / len(self.publishers)
        while not self._stop.is_set():
            elapsed = time.monotonic() - started
            for publisher in self.publishers:
                # Staggered by 1/rate each: one message every 1/rate seconds in all.
                owed = int((elapsed - publisher.index / self.rate) * share)
                if publisher.seq < owed and publisher.can_send():
                    while publisher.seq < owed:
                        publisher.next()
            time.sleep(0.002)

    def stop_publishing(self, timeout: float = 60.0) -> int:
        """Stop sending and wait up to ``timeout`` seconds for the PUBACKs of what was sent;
        returns how many are still missing."""
        self._stop.set()
        if self._pacer is not None:
            self._pacer.join()
        deadline = time.monotonic() + timeout
        while (left := sum(p.pending() for p in self.publishers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def drain(self, quiet: float = 60.0) -> int:
        """Wait for each publisher's ordering marker, its newest acknowledged message, to be
        delivered (giving up once nothing has been delivered for ``quiet`` seconds); returns
        how many acknowledged messages were not delivered: lost (:meth:`Ledger.drain`)."""
        self.report()  # matches the PUBACKs that came: the markers are the newest of them
        return self.ledger.drain(quiet)

    def report(self) -> Report:
        """The ledger's counts (resolving the PUBACKs that came)."""
        for publisher in self.publishers:
            publisher.resolve()
        return self.ledger.report()

    def close(self) -> None:
        """Stop publishing, disconnect everyone, and end the sessions the run made (each
        client connects once more with a clean session), best effort."""
        self._stop.set()
        if self._pacer is not None:
            self._pacer.join()
        clients = [p.client for p in self.publishers] + [self.subscriber]
        for client in clients:
            client.disconnect()
            client.loop_stop()
        for client_id in [f"{self.prefix}-pub-{p.index}" for p in self.publishers] + [
            f"{self.prefix}-sub"
        ]:
            _end_session(client_id, self.host, self.port, self.version)


def _end_session(client_id: str, host: str, port: int, version: int) -> None:
    """Connect as ``client_id`` once with a clean session (its stored session goes), then
    disconnect; errors are ignored (the broker may be down)."""
    cleaner = paho.Client(
        CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=paho.MQTTv5 if version == 5 else paho.MQTTv311,
        clean_session=None if version == 5 else True,
    )
    done = threading.Event()
    cleaner.on_connect = lambda *_: done.set()
    try:
        if version == 5:
            cleaner.connect(host, port, keepalive=30, clean_start=True)
        else:
            cleaner.connect(host, port, keepalive=30)
        cleaner.loop_start()
        done.wait(5.0)
        cleaner.disconnect()
        cleaner.loop_stop()
    except OSError:
        return


def _wait(condition: Callable[[], bool], timeout: float, what: str, quiet: bool = False) -> None:
    """Poll ``condition`` until true; ``TimeoutError`` naming ``what`` (unless ``quiet``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            if quiet:
                return
            raise TimeoutError(f"{what} did not come within {timeout:g}s")
        time.sleep(0.02)
