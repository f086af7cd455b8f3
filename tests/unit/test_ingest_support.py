"""A test client for the sans-IO ingest core, and checks of the client itself.

:class:`Client` drives one :class:`ServerConnection` the way an MQTT client would: it encodes
real packets with the codec, feeds their bytes to the connection, and decodes what the server
sends with a client-side :class:`StreamDecoder`, so every byte the server writes is checked
against the codec's rules. Other ``test_ingest_*`` modules import it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import pytest

from services.common.auth.authorize import ALLOW_ALL_RULE
from services.common.auth.certificates import CertificateIdentity
from services.common.auth.principal import Accepted, Outcome, Principal
from services.common.mqtt.codec import StreamDecoder, encode
from services.common.mqtt.packets import ConnAck, Connect, Packet, PacketType
from services.common.mqtt.properties import Properties, encode_properties
from services.common.records import PublishMeta, SessionRecord
from services.common.settings import Settings
from services.common.subscription import Subscription
from services.ingest.connection import ServerConnection
from services.ingest.effects import (
    Authenticate,
    Close,
    Connected,
    Effect,
    RecordEvent,
    Send,
    StoreEffect,
    StorePublish,
    StoreSession,
    StoreWill,
    SyncState,
)
from services.ingest.fan_out import FanOut
from services.ingest.limits import Limits
from services.ingest.state import CheckBlocked, ServerContext

E = TypeVar("E")

NODE_ID = "node-a"
CONNECTION_ID = bytes(range(16))
NOW_MS = 1_700_000_000_000
#: The Kafka offset of the connection's session record (its connect record) in tests.
SESSION_OFFSET = 10
#: An offset after it: a record there is newer than the connection's own.
LATER = SESSION_OFFSET + 1
#: Assigned Client Identifiers of the test clients: ``assigned-1``, ``assigned-2``, ...
_ASSIGNED = itertools.count(1)


ANONYMOUS = Principal(None, None, None, (ALLOW_ALL_RULE,), None, client_id_bound=True)
"""An anonymous client allowed everything (``allow all #``, as the local cluster's)."""


def accept_anonymous(_request: Authenticate) -> Outcome:
    """The shell's answer to every credential check of an anonymous-only node."""
    return Accepted(ANONYMOUS)


def make_settings(**overrides: Any) -> Settings:
    """Settings with their defaults and ``overrides``; never read from the environment."""
    return Settings.model_construct(**overrides)


class Client:
    """One MQTT client talking to one :class:`ServerConnection`, with bytes only.

    ``previous`` is what the state topics know of this client id (session record and
    subscriptions). Every effect the connection returns is also kept in :attr:`log`, except
    the ``client.events`` records (:class:`RecordEvent`), which go to :attr:`events` only:
    they ride along every connect, subscription and disconnect, and are checked on their own.
    ``authenticate`` plays the shell's credential check: each
    :class:`~services.ingest.effects.Authenticate` effect is answered with its outcome at
    once (kept in :attr:`auth_requests`); None leaves them in the effects. ``blocked``
    judges each CONNECT against blocked clients (none blocked by default).
    """

    def __init__(
        self,
        version: int = 5,
        settings: Settings | None = None,
        previous: tuple[SessionRecord | None, list[Subscription]] = (None, []),
        authenticate: Callable[[Authenticate], Outcome] | None = accept_anonymous,
        certificate: CertificateIdentity | None = None,
        blocked: CheckBlocked | None = None,
    ) -> None:
        self.version = version
        self.authenticate = authenticate
        self.auth_requests: list[Authenticate] = []
        self.settings = settings or make_settings()
        self.previous = previous
        self.looked_up: list[str] = []
        self.now = NOW_MS
        #: The monotonic clock (seconds) Keep Alive is measured on; tests move it.
        self.clock = 0.0
        server = ServerContext(
            Limits.from_settings(self.settings),
            NODE_ID,
            self._previous_session,
            lambda: self.now,
            lambda: f"assigned-{next(_ASSIGNED)}",
            lambda: self.clock,
            **({} if blocked is None else {"blocked": blocked}),
        )
        self.conn = ServerConnection(server, CONNECTION_ID, certificate)
        self.decoder = StreamDecoder(protocol_version=version)
        self.log: list[Effect] = []
        self.events: list[RecordEvent] = []

    def _previous_session(self, client_id: str) -> tuple[SessionRecord | None, list[Subscription]]:
        self.looked_up.append(client_id)
        return self.previous

    # ------------------------------------------------------------------ driving

    def _keep(self, effects: list[Effect]) -> list[Effect]:
        self.events += [e for e in effects if isinstance(e, RecordEvent)]
        effects = [e for e in effects if not isinstance(e, RecordEvent)]
        self.log.extend(effects)
        return effects

    def send(self, *packets: Packet) -> list[Effect]:
        """Encode ``packets`` for this client's version and feed them in one read."""
        return self.send_bytes(b"".join(encode(p, self.version) for p in packets))

    def send_bytes(self, data: bytes) -> list[Effect]:
        """Feed raw bytes to the connection."""
        return self._keep(self._answered(self.conn.receive_data(data)))

    def _answered(self, effects: list[Effect]) -> list[Effect]:
        """``effects`` with each credential check replaced by what its outcome brings."""
        if self.authenticate is None:
            return effects
        out: list[Effect] = []
        for effect in effects:
            if isinstance(effect, Authenticate):
                self.auth_requests.append(effect)
                out += self._answered(self.conn.authenticated(self.authenticate(effect)))
            else:
                out.append(effect)
        return out

    def authenticated(self, outcome: Outcome) -> list[Effect]:
        """Report the outcome of a credential check the test answers itself."""
        return self._keep(self._answered(self.conn.authenticated(outcome)))

    def lost(self) -> list[Effect]:
        """The socket closed (``ServerConnection.connection_lost``)."""
        return self._keep(self.conn.connection_lost())

    def stored(self, token: int) -> list[Effect]:
        """Kafka stored the effect ``token``."""
        return self._keep(self.conn.stored(token))

    def store_failed(self, token: int) -> list[Effect]:
        """Kafka refused the effect ``token``."""
        return self._keep(self.conn.store_failed(token))

    def store_all(self, effects: Iterable[Effect]) -> list[Effect]:
        """Kafka stored every store effect of ``effects``, in order; returns what followed
        (store effects among them are stored too, until none is left)."""
        after: list[Effect] = []
        todo = store_effects(effects)
        while todo:
            more = self.stored(todo.pop(0).token)
            after += more
            todo += store_effects(more)
        return after

    def connect(
        self,
        client_id: str = "c1",
        clean_start: bool = True,
        keep_alive: int = 30,
        properties: Properties | None = None,
    ) -> ConnAck:
        """CONNECT, let Kafka store the session record, and return the CONNACK."""
        connect = Connect(
            self.version, client_id, clean_start, keep_alive, properties=properties or Properties()
        )
        effects = self.send(connect)
        record = only(effects, StoreSession)
        self.conn.session_stored_at(SESSION_OFFSET)
        after = self.stored(record.token)
        for sync in of_type(after, SyncState):  # a resumed session another connection held
            after = self.stored(sync.token)
        packets = self.packets(after)
        assert len(packets) == 1 and isinstance(packets[0], ConnAck), packets
        assert packets[0].reason_code == 0
        assert Connected(self.conn.client_id) in after
        return packets[0]

    # ------------------------------------------------------------------ reading effects

    def packets(self, effects: Iterable[Effect]) -> list[Packet]:
        """Decode, as the client would, every packet the ``Send`` effects carry."""
        data = b"".join(e.data for e in effects if isinstance(e, Send))
        return self.decoder.feed(data)


def of_type(effects: Iterable[Any], kind: type[E]) -> list[E]:
    """The effects (or packets) of one type, in order."""
    return [e for e in effects if isinstance(e, kind)]


def only(effects: Iterable[Any], kind: type[E]) -> E:
    """The single effect (or packet) of ``kind``; fails if there is not exactly one."""
    found = of_type(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {found!r}"
    return found[0]


def closes(effects: Iterable[Effect]) -> bool:
    """True if the effects end by closing the connection."""
    effects = list(effects)
    return bool(effects) and isinstance(effects[-1], Close)


def store_effects(effects: Iterable[Effect]) -> list[StoreEffect]:
    """The effects that write one record to Kafka and report back by token."""
    return [e for e in effects if isinstance(e, StoreEffect)]


def fan_out(
    topic: str,
    payload: bytes,
    properties: Properties | None = None,
    *,
    retain: bool = False,
    qos: int = 2,
    received_at_ms: int = NOW_MS,
) -> FanOut:
    """A routed message as a downlink record brings it (published at ``received_at_ms``
    with ``qos``, RETAIN and v5 ``properties``), fanned out at ``received_at_ms``."""
    raw = encode_properties(properties, PacketType.PUBLISH) if properties else b""
    meta = PublishMeta(topic, qos, retain, received_at_ms, 5, raw)
    return FanOut(meta, payload, received_at_ms)


def wills(effects: Iterable[Effect]) -> list[StoreWill]:
    """The Will Messages a closing connection's effects publish, as :class:`StoreWill`
    (one published at once is its ``msg.all`` record: delay 0)."""
    found: list[StoreWill] = []
    for e in effects:
        if isinstance(e, StoreWill):
            found.append(e)
        elif isinstance(e, StorePublish):
            found.append(StoreWill(e.token, 0, CONNECTION_ID, None, e.meta, e.payload))
    return found


# ---------------------------------------------------------------------- the harness itself


def test_client_connects_and_decodes_the_connack() -> None:
    client = Client(version=5)
    connack = client.connect("me")
    assert connack.session_present is False
    assert client.conn.client_id == "me"
    assert client.looked_up == ["me"]


def test_only_rejects_zero_or_many() -> None:
    effects: list[Effect] = [Close("a"), Close("b")]
    with pytest.raises(AssertionError):
        only(effects, Close)
    with pytest.raises(AssertionError):
        only(effects, Send)
    assert of_type(effects, Send) == []
    assert closes(effects)
