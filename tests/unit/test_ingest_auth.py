"""Authentication and authorization in the sans-IO ingest core, with bytes alone: the CONNECT
that asks, the outcomes it gets (CONNACK Reason Codes, MQTT 3.2.2.2; v3.1.1 return codes),
the AUTH exchange of enhanced authentication and re-authentication (MQTT 5.0 4.12), and the
rules applied to PUBLISH, SUBSCRIBE and the Will Message; a credential that changes or goes
away while the client is connected.

The test client plays the shell: it answers each ``Authenticate`` effect with the outcome a
test gives (services/common/auth/authenticate.py decides them; tested on its own).
"""

from __future__ import annotations

import logging
import uuid

import pytest
from test_ingest_support import (
    ANONYMOUS,
    NOW_MS,
    Client,
    closes,
    fan_out,
    of_type,
    only,
    store_effects,
)

from services.common.auth.authorize import parse_rules
from services.common.auth.certificates import CertificateIdentity
from services.common.auth.principal import Accepted, Challenge, Principal, Refused, ScramState
from services.common.auth.scram import ScramExchange
from services.common.metrics import MQTT
from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    SubscriptionRequest,
    Will,
)
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    AckKind,
    ClientKind,
    DisconnectCause,
    EventKind,
    SessionRecord,
    Target,
)
from services.common.subscription import Subscription
from services.ingest.effects import (
    Authenticate,
    Effect,
    StoreAcks,
    StoreDelayed,
    StorePublish,
    StoreRetainedRequest,
    StoreSession,
    StoreSubscriptions,
)
from services.ingest.handle_auth import REFUSALS

CREDENTIAL = uuid.UUID(int=7)
RULES = parse_rules(
    [
        "allow publish devices/${client_id}/#",
        "allow subscribe commands/${client_id}/#",
        "deny subscribe admin/#",
        "allow subscribe shared/#",
        "allow subscribe #",
    ]
)
SCRAM = "SCRAM-SHA-256"


def device(rules: tuple[object, ...] = RULES, revision: int = 1) -> Principal:
    """A DEVICE credential's principal with ``rules``."""
    return Principal(CREDENTIAL, "dev", ClientKind.DEVICE, rules, "alice", revision, True)  # type: ignore[arg-type]


def connected(version: int = 5, principal: Principal | None = None, **connect: object) -> Client:
    """A client authenticated as ``principal`` (default: :func:`device`), CONNACK received."""
    who = principal or device()
    client = Client(version, authenticate=lambda _request: Accepted(who))
    client.connect("dev-1", **connect)  # type: ignore[arg-type]
    return client


def _scram_state() -> ScramState:
    return ScramState(ScramExchange(SCRAM), None)


# ---------------------------------------------------------------------- CONNECT


def test_connect_asks_the_shell_with_what_the_client_presents() -> None:
    identity = CertificateIdentity("dev-1", (), "c" * 64, "CN=dev-1")
    client = Client(5, authenticate=None, certificate=identity)
    client.conn.state.client_address = "[2001:db8::7]:50123"
    effects = client.send(Connect(5, "dev-1", True, 30, "alice", b"\x00pw\xff"))
    request = only(effects, Authenticate).request
    assert request.address == "2001:db8::7"  # failures are counted against it
    assert (request.client_id, request.username, request.password) == (
        "dev-1",
        "alice",
        b"\x00pw\xff",
    )
    assert request.certificate == identity and request.method is None
    assert not store_effects(effects)  # nothing stored before the credentials are checked
    record = only(client.authenticated(Accepted(device())), StoreSession).record
    assert record is not None and record.kind is ClientKind.DEVICE


@pytest.mark.parametrize(
    ("reason", "v3_code"),
    [
        (ReasonCode.BAD_USER_NAME_OR_PASSWORD, 4),
        (ReasonCode.NOT_AUTHORIZED, 5),
        (ReasonCode.BANNED, 5),
        (ReasonCode.SERVER_UNAVAILABLE, 3),
        (ReasonCode.SERVER_BUSY, 3),
        (ReasonCode.CONNECTION_RATE_EXCEEDED, 3),
    ],
)
@pytest.mark.parametrize("version", [4, 5])
def test_a_refused_connect_gets_its_reason_code(version: int, reason: int, v3_code: int) -> None:
    client = Client(version, authenticate=lambda _r: Refused(reason, "wrong password for alice"))
    effects = client.send(Connect(version, "c", True, 30, "alice", b"x"))
    connack = only(client.packets(effects), ConnAck)
    assert connack.reason_code == (reason if version == 5 else v3_code)
    if version == 5:  # the same words whatever the detail: nothing about alice
        assert "alice" not in (connack.properties.reason_string or "")
        assert connack.properties.reason_string in REFUSALS.values()
    assert closes(effects)
    failures = [e.event for e in client.events if e.event.kind is EventKind.AUTH_FAILED]
    credential_refusal = reason not in (
        ReasonCode.SERVER_UNAVAILABLE,
        ReasonCode.SERVER_BUSY,
        ReasonCode.CONNECTION_RATE_EXCEEDED,  # throttled: nothing was checked
    )
    assert [f.reason_code for f in failures] == ([reason] if credential_refusal else [])


def test_the_credentials_kind_wins_over_the_client_id_patterns() -> None:
    app = Principal(CREDENTIAL, "app", ClientKind.APPLICATION, (), None)
    client = Client(5, authenticate=lambda _r: Accepted(app))
    effects = client.send(Connect(5, "plain-id", True, 30))
    assert only(effects, StoreSession).record.kind is ClientKind.APPLICATION  # type: ignore[union-attr]
    anonymous = Client(5, client.settings.model_copy(update={"application_client_ids": ["ap*"]}))
    record = only(anonymous.send(Connect(5, "app-2", True, 30)), StoreSession).record
    assert record is not None and record.kind is ClientKind.APPLICATION


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 5)])
def test_a_will_topic_the_rules_refuse_refuses_the_connect(version: int, code: int) -> None:
    client = Client(version, authenticate=lambda _r: Accepted(device()))
    effects = client.send(Connect(version, "dev-1", True, 30, will=Will("alarms/x", b"gone")))
    assert only(client.packets(effects), ConnAck).reason_code == code
    allowed = Client(version, authenticate=lambda _r: Accepted(device()))
    will = Will("devices/dev-1/state", b"gone")
    assert only(allowed.send(Connect(version, "dev-1", True, 30, will=will)), StoreSession)


def test_a_resumed_session_keeps_only_the_subscriptions_the_rules_grant() -> None:
    previous = SessionRecord(
        "n2", b"p" * 16, False, 5, False, True, session_expiry_interval=60, updated_at_ms=NOW_MS
    )
    subs = [Subscription("dev-1", f, 1) for f in ("commands/dev-1/#", "admin/#", "a/b")]
    client = Client(5, previous=(previous, subs), authenticate=lambda _r: Accepted(device()))
    effects = client.send(Connect(5, "dev-1", False, 30))
    kept = only(effects, StoreSubscriptions).subscriptions
    assert [s.topic_filter for s in kept] == ["commands/dev-1/#", "a/b"]
    dropped = [e.event for e in client.events if e.event.kind is EventKind.UNSUBSCRIBED]
    assert dropped[0].topic_filters == (("admin/#", 0),)


def test_client_id_rules_of_a_principal_not_bound_to_it_grant_nothing() -> None:
    # A credential stored before such rules were refused at creation: any client id would do.
    unbound = Principal(CREDENTIAL, "dev", ClientKind.DEVICE, RULES, "alice", 1, False)
    client = connected(5, unbound)
    effects = client.send(Publish("devices/dev-1/t", b"x", qos=1, packet_id=1))
    assert only(client.packets(effects), PubAck).reason_code == 0x87
    bound = connected(5)
    effects = bound.send(Publish("devices/dev-1/t", b"x", qos=1, packet_id=1))
    assert only(effects, StorePublish)


# ---------------------------------------------------------------------- session ownership


OTHER = Principal(uuid.UUID(int=8), "other", ClientKind.DEVICE, RULES, "mallory")


def _owned(connected: bool, owner: str | None = str(CREDENTIAL)) -> SessionRecord:
    return SessionRecord(
        "n2", b"p" * 16, connected, 5, False, True, session_expiry_interval=60,
        updated_at_ms=NOW_MS, owner=owner,
    )  # fmt: skip


@pytest.mark.parametrize("owner_connected", [True, False])
@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 5)])
@pytest.mark.parametrize("clean_start", [False, True])
def test_another_principal_cannot_resume_or_replace_a_session(
    owner_connected: bool, version: int, code: int, clean_start: bool
) -> None:
    subs = [Subscription("dev-1", "commands/dev-1/#", 1)]
    client = Client(
        version, previous=(_owned(owner_connected), subs), authenticate=lambda _r: Accepted(OTHER)
    )
    effects = client.send(Connect(version, "dev-1", clean_start, 30))
    connack = only(client.packets(effects), ConnAck)
    assert (connack.reason_code, connack.session_present) == (code, False)
    assert closes(effects)
    assert store_effects(effects) == []  # neither the session nor its subscriptions touched
    assert [(e.event.kind, e.event.reason_code) for e in client.events] == [
        (EventKind.AUTH_FAILED, 0x87)
    ]


def test_the_owner_resumes_its_session_and_its_record_names_it() -> None:
    subs = [Subscription("dev-1", "commands/dev-1/#", 1)]
    client = Client(5, previous=(_owned(False), subs), authenticate=lambda _r: Accepted(device()))
    effects = client.send(Connect(5, "dev-1", False, 30))
    record = only(effects, StoreSession).record
    assert record is not None and record.owner == str(CREDENTIAL)
    client.conn.session_stored_at(11)
    after = client.stored(only(effects, StoreSession).token)
    assert only(client.packets(after), ConnAck).session_present


@pytest.mark.parametrize(
    "previous",
    [
        _owned(False, owner=None),  # written before owners were recorded
        SessionRecord("n2", b"p" * 16, False, 5, False, True, session_expiry_interval=60,
                      updated_at_ms=NOW_MS - 61_000, owner=str(CREDENTIAL)),  # expired
        SessionRecord("n2", b"p" * 16, False, 5, True, False, owner=str(CREDENTIAL)),  # ended
    ],
)  # fmt: skip
def test_a_session_nobody_holds_goes_to_the_next_principal(previous: SessionRecord) -> None:
    client = Client(5, previous=(previous, []), authenticate=lambda _r: Accepted(OTHER))
    record = only(client.send(Connect(5, "dev-1", False, 30)), StoreSession).record
    assert record is not None and record.owner == str(OTHER.credential_id)


def test_anonymous_is_a_principal_of_its_own() -> None:
    anonymous_session = _owned(False, owner="anonymous")
    client = Client(5, previous=(anonymous_session, []), authenticate=lambda _r: Accepted(device()))
    refused = client.packets(client.send(Connect(5, "dev-1", False, 30)))
    assert only(refused, ConnAck).reason_code == 0x87
    mine = Client(5, previous=(_owned(True), []))  # anonymous, against a credential's session
    assert only(mine.packets(mine.send(Connect(5, "dev-1", True, 30))), ConnAck).reason_code == 0x87
    again = Client(5, previous=(anonymous_session, []))
    record = only(again.send(Connect(5, "dev-1", False, 30)), StoreSession).record
    assert record is not None and record.owner == "anonymous"


def test_refused_takeovers_are_counted_and_logged_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = MQTT.session_owner_refusals
    client = Client(5, previous=(_owned(True), []), authenticate=lambda _r: Accepted(OTHER))
    context = client.conn.state.server
    for at in (NOW_MS, NOW_MS + 30_000, NOW_MS + 61_000):
        client.now = at
        attempt = Client(5, previous=(_owned(True), []), authenticate=lambda _r: Accepted(OTHER))
        attempt.conn.state.server = context  # one node: one context shared by its connections
        with caplog.at_level(logging.WARNING, "services.ingest.handle_connect"):
            attempt.send(Connect(5, "dev-1", True, 30))
    assert MQTT.session_owner_refusals == before + 3
    warnings = [r for r in caplog.records if "belongs to" in r.getMessage()]
    assert len(warnings) == 2


# ---------------------------------------------------------------------- PUBLISH


def test_v5_publishes_the_rules_refuse_get_0x87_in_their_place() -> None:
    client = connected(5)
    effects = client.send(
        Publish("devices/dev-1/t", b"1", qos=1, packet_id=1),
        Publish("devices/dev-2/t", b"2", qos=1, packet_id=2),
        Publish("devices/dev-2/t", b"3", qos=2, packet_id=3),
        Publish("devices/dev-2/t", b"4", qos=0),
    )
    stored = of_type(effects, StorePublish)
    assert [s.payload for s in stored] == [b"1"]
    assert client.packets(effects) == []  # the PUBACK of 1 waits for Kafka, 2 and 3 behind it
    answers = client.packets(client.stored(stored[0].token))
    assert [(type(p), p.packet_id, p.reason_code) for p in answers] == [  # type: ignore[union-attr]
        (PubAck, 1, 0),
        (PubAck, 2, ReasonCode.NOT_AUTHORIZED),
        (PubRec, 3, ReasonCode.NOT_AUTHORIZED),
    ]


def test_v311_publishes_the_rules_refuse_are_acknowledged_and_dropped() -> None:
    client = connected(4)
    effects = client.send(
        Publish("devices/dev-2/t", b"1", qos=1, packet_id=1),
        Publish("devices/dev-2/t", b"2", qos=2, packet_id=2),
    )
    assert not of_type(effects, StorePublish)
    assert [(type(p), p.packet_id) for p in client.packets(effects)] == [(PubAck, 1), (PubRec, 2)]  # type: ignore[union-attr]
    assert only(client.packets(client.send(PubRel(2))), PubComp).reason_code == 0


@pytest.mark.parametrize(("version", "refused"), [(5, ReasonCode.NOT_AUTHORIZED), (4, 0)])
def test_a_delayed_publish_is_authorized_for_its_target_topic(version: int, refused: int) -> None:
    """The rules allow ``devices/dev-1/#`` only: ``$delayed/5/devices/dev-1/t`` is taken
    (no rule names ``$delayed/...``), ``$delayed/5/devices/dev-2/t`` is refused now, at
    publish time, not when it would be published."""
    client = connected(version)
    effects = client.send(
        Publish("$delayed/5/devices/dev-1/t", b"1", qos=1, packet_id=1),
        Publish("$delayed/5/devices/dev-2/t", b"2", qos=1, packet_id=2),
    )
    [stored] = store_effects(effects)
    assert isinstance(stored, StoreDelayed) and stored.meta.topic == "devices/dev-1/t"
    answers = client.packets(client.stored(stored.token))
    assert [(p.packet_id, p.reason_code) for p in answers] == [(1, 0), (2, refused)]  # type: ignore[attr-defined]


def test_a_retained_publish_the_rules_refuse_is_not_kept() -> None:
    client = connected(5)
    effects = client.send(Publish("config/x", b"r", qos=1, retain=True, packet_id=1))
    assert not store_effects(effects)
    assert only(client.packets(effects), PubAck).reason_code == ReasonCode.NOT_AUTHORIZED


# ---------------------------------------------------------------------- SUBSCRIBE


@pytest.mark.parametrize(("version", "refused"), [(5, 0x87), (4, 0x80)])
def test_subscribe_filters_are_granted_one_by_one(version: int, refused: int) -> None:
    client = connected(version)
    requests = [SubscriptionRequest(f, 1) for f in ("#", "admin/users", "$share/g/shared/+", "x/+")]
    effects = client.send(Subscribe(1, requests))
    wanted = only(effects, StoreRetainedRequest).subscriptions
    assert [s.topic_filter for s in wanted] == ["#", "x/+"]  # none for the refusal
    suback = only(client.packets(client.store_all(effects)), SubAck)
    # "#" overlaps the denied admin/# but reaches allowed topics: granted, filtered at delivery
    assert suback.reason_codes == [1, refused, 1, 1]


def _published(client: Client, effects: list[Effect]) -> list[tuple[str, bytes]]:
    return [(p.topic, p.payload) for p in of_type(client.packets(effects), Publish)]


@pytest.mark.parametrize("version", [4, 5])
def test_a_wildcard_over_a_denied_subtree_gets_only_the_readable_topics(version: int) -> None:
    client = connected(version)
    client.store_all(client.send(Subscribe(1, [SubscriptionRequest("#", 1)])))
    for qos in (0, 1):
        for retain in (False, True):  # live, and retained as sent on SUBSCRIBE
            denied = fan_out("admin/users", b"secret", retain=retain, qos=qos)
            target = Target("dev-1", qos, retain_as_published=retain)
            assert client._keep(client.conn.deliver_routed(denied, target)) == []
            allowed = fan_out("news/today", b"public", retain=retain, qos=qos)
            effects = client._keep(client.conn.deliver_routed(allowed, target))
            assert _published(client, effects) == [("news/today", b"public")]
    assert MQTT.publish_withheld >= 4


@pytest.mark.parametrize(("qos", "acks"), [
    (1, [(AckKind.PUBACK, 40)]), (2, [(AckKind.PUBREC, 40), (AckKind.PUBCOMP, 40)])
])  # fmt: skip
def test_a_withheld_stored_message_is_reported_complete_to_its_store(
    qos: int, acks: list[tuple[AckKind, int]]
) -> None:
    """A persistent session's stored message (or an APPLICATION client's) comes with the
    store's Packet Identifier: withheld, it must not stay in the store's window forever."""
    client = connected(5)
    client.store_all(client.send(Subscribe(1, [SubscriptionRequest("#", 2)])))
    target = Target("dev-1", qos, packet_id=40)
    effects = client._keep(client.conn.deliver_routed(fan_out("admin/x", b"s", qos=qos), target))
    assert _published(client, effects) == []
    assert only(effects, StoreAcks).record.acks == acks
    resent = client._keep(client.conn.deliver(Publish("admin/x", b"s", qos, True, True, 41)))
    assert _published(client, resent) == [] and only(resent, StoreAcks)
    live = client._keep(client.conn.deliver_routed(fan_out("a/b", b"ok", qos=qos), Target(
        "dev-1", qos, packet_id=42)))  # fmt: skip
    assert _published(client, live) == [("a/b", b"ok")]


def test_a_strict_credential_refuses_a_filter_overlapping_a_denied_subtree() -> None:
    strict = Principal(
        CREDENTIAL, "dev", ClientKind.DEVICE, RULES, "alice", 1, strict_subscribe=True
    )
    client = connected(5, strict)
    requests = [SubscriptionRequest(f, 1) for f in ("#", "news/#")]
    effects = client.send(Subscribe(1, requests))
    assert only(client.packets(client.store_all(effects)), SubAck).reason_codes == [0x87, 1]


def test_a_shared_subscription_member_gets_only_the_readable_topics() -> None:
    client = connected(5)
    effects = client.send(Subscribe(1, [SubscriptionRequest("$share/g/#", 1)]))
    assert only(client.packets(client.store_all(effects)), SubAck).reason_codes == [1]
    target = Target("dev-1", 1)
    assert client._keep(client.conn.deliver_routed(fan_out("admin/a", b"s"), target)) == []
    effects = client._keep(client.conn.deliver_routed(fan_out("shared/a", b"ok"), target))
    assert _published(client, effects) == [("shared/a", b"ok")]


@pytest.mark.parametrize(("version", "code"), [(5, ReasonCode.SERVER_BUSY), (4, 0x03)])
def test_a_check_not_done_within_the_connect_timeout_is_answered_server_busy(
    version: int, code: int
) -> None:
    client = Client(version, authenticate=None)
    only(client.send(Connect(version, "dev-1", True, 30, "alice", b"pw")), Authenticate)
    assert client.conn.keep_alive_timeout == client.conn.state.limits.connect_timeout_seconds
    effects = client.conn.keep_alive_expired()
    assert only(client.packets(effects), ConnAck).reason_code == code
    assert closes(effects) and client.conn.closed
    assert client.authenticated(Accepted(device())) == []  # the late outcome changes nothing


# ---------------------------------------------------------------------- enhanced authentication


def test_scram_over_auth_packets_to_connack() -> None:
    client = Client(5, authenticate=None)
    props = Properties(authentication_method=SCRAM, authentication_data=b"n,,n=alice,r=abc")
    request = only(client.send(Connect(5, "dev-1", True, 30, properties=props)), Authenticate)
    assert (request.request.method, request.request.data) == (SCRAM, b"n,,n=alice,r=abc")
    state = _scram_state()
    challenge = only(client.packets(client.authenticated(Challenge(b"r=abcxyz", state))), Auth)
    assert challenge.reason_code == ReasonCode.CONTINUE_AUTHENTICATION
    assert challenge.properties.authentication_method == SCRAM
    assert challenge.properties.authentication_data == b"r=abcxyz"
    answer = Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=b"c=biws"))
    second = only(client.send(answer), Authenticate)
    assert second.state is state and second.request.data == b"c=biws"
    effects = client.authenticated(Accepted(device(), b"v=signature"))
    connack = only(client.packets(client.store_all(effects)), ConnAck)
    assert connack.reason_code == 0
    assert connack.properties.authentication_method == SCRAM
    assert connack.properties.authentication_data == b"v=signature"


def _challenged() -> Client:
    client = Client(5, authenticate=None)
    props = Properties(authentication_method=SCRAM, authentication_data=b"n,,n=a,r=b")
    client.send(Connect(5, "dev-1", True, 30, properties=props))
    client.authenticated(Challenge(b"r=bc", _scram_state()))
    return client


def test_a_client_silent_after_the_challenge_is_closed_at_the_connect_timeout() -> None:
    client = _challenged()
    effects = client.conn.keep_alive_expired()
    assert client.packets(effects) == [] and closes(effects)


@pytest.mark.parametrize(
    ("packet", "code"),
    [
        (Auth(0x18, Properties(authentication_method="SCRAM-SHA-512")), 0x8C),
        (Auth(0x19, Properties(authentication_method=SCRAM)), 0x82),
        (Publish("a", b"early"), 0x82),
        (Subscribe(1, [SubscriptionRequest("a", 0)]), 0x82),
    ],
)
def test_enhanced_authentication_out_of_order_is_refused(packet: object, code: int) -> None:
    client = _challenged()
    effects = client.send(packet)  # type: ignore[arg-type]
    assert only(client.packets(effects), ConnAck).reason_code == code
    assert closes(effects)


def test_an_error_connack_cannot_name_is_refused_as_a_protocol_error() -> None:
    # Found by the fuzzer (tests/fuzz/corpus/connect): a PUBLISH with Topic Alias 0 sent
    # while the CONNECT's credentials are checked was answered CONNACK 0x94, a Reason Code
    # CONNACK may not carry (MQTT 5.0 3.2.2.2).
    client = Client(5, authenticate=None)
    only(client.send(Connect(5, "dev-1", True, 30, "alice", b"pw")), Authenticate)
    early = Publish("a", b"x", qos=1, packet_id=2, properties=Properties(topic_alias=0))
    effects = client.send_bytes(encode(early, 5))
    assert only(client.packets(effects), ConnAck).reason_code == ReasonCode.PROTOCOL_ERROR
    assert closes(effects)


def test_auth_without_enhanced_authentication_is_a_protocol_error() -> None:
    client = connected(5)
    effects = client.send(Auth(0x19, Properties(authentication_method=SCRAM)))
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    early = Client(5, authenticate=None)
    early.send(Connect(5, "c", True, 30))
    effects = early.send(Auth(0x18, Properties(authentication_method=SCRAM)))
    assert only(early.packets(effects), ConnAck).reason_code == ReasonCode.PROTOCOL_ERROR


def _enhanced_connected() -> Client:
    client = Client(5, authenticate=None)
    props = Properties(authentication_method=SCRAM, authentication_data=b"n,,n=a,r=b")
    client.send(Connect(5, "dev-1", True, 30, properties=props))
    client.store_all(client.authenticated(Accepted(device(), b"v=1")))
    return client


def test_re_authentication_ends_with_auth_success_and_the_new_rules() -> None:
    client = _enhanced_connected()
    start = Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=b"n,,n=a,r=c"))
    assert only(client.send(start), Authenticate).state is None
    again = client.send(Auth(0x19, Properties(authentication_method=SCRAM)))
    assert only(client.packets(again), Disconnect).reason_code == ReasonCode.PROTOCOL_ERROR
    client = _enhanced_connected()
    client.send(start)
    challenge = client.packets(client.authenticated(Challenge(b"r=cd", _scram_state())))
    assert only(challenge, Auth).reason_code == ReasonCode.CONTINUE_AUTHENTICATION
    client.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=b"c")))
    effects = client.authenticated(Accepted(device(parse_rules(["allow all other/#"]), 2), b"v=2"))
    done = only(client.packets(effects), Auth)
    assert (done.reason_code, done.properties.authentication_data) == (0, b"v=2")
    refused = client.send(Publish("devices/dev-1/x", b"", qos=1, packet_id=5))
    assert only(client.packets(refused), PubAck).reason_code == ReasonCode.NOT_AUTHORIZED


def test_re_authentication_as_another_principal_disconnects_with_0x87() -> None:
    client = _enhanced_connected()
    client.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=b"x")))
    effects = client.authenticated(Accepted(OTHER, b"v=2"))
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.NOT_AUTHORIZED
    assert closes(effects)
    assert client.conn.state.principal is not None
    assert client.conn.state.principal.owner == str(CREDENTIAL)  # still the owner's


def test_a_failed_re_authentication_disconnects_with_0x87() -> None:
    client = _enhanced_connected()
    client.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=b"x")))
    effects = client.authenticated(Refused(ReasonCode.BAD_USER_NAME_OR_PASSWORD, "proof"))
    assert only(client.packets(effects), Disconnect).reason_code == ReasonCode.NOT_AUTHORIZED
    assert closes(effects)
    client.lost()
    kinds = [(e.event.kind, e.event.cause) for e in client.events]
    assert (EventKind.AUTH_FAILED, DisconnectCause.NONE) in kinds
    assert (EventKind.DISCONNECTED, DisconnectCause.NOT_AUTHORIZED) in kinds


# ---------------------------------------------------------------------- credential changes


def test_a_revoked_credential_disconnects_with_0x98() -> None:
    client = connected(5)
    effects = client._keep(client.conn.revoked("credential disabled"))
    assert only(client.packets(effects), Disconnect).reason_code == 0x98
    client.lost()
    ends = [e.event for e in client.events if e.event.kind is EventKind.DISCONNECTED]
    assert (ends[0].cause, ends[0].reason_code) == (DisconnectCause.ADMINISTRATIVE_ACTION, 0x98)
    v3 = connected(4)
    assert closes(v3.conn.revoked("credential deleted"))  # v3.1.1 has no DISCONNECT to send


def test_changed_rules_apply_at_once_and_drop_what_they_no_longer_grant() -> None:
    client = connected(5)
    client.store_all(client.send(Subscribe(1, [SubscriptionRequest("news/#", 1)])))
    effects = client._keep(
        client.conn.principal_changed(device(parse_rules(["allow all devices/#"]), 2))
    )
    assert only(effects, StoreSubscriptions).subscriptions == []
    ok = client.send(Publish("devices/dev-9/x", b"", qos=0))
    assert of_type(ok, StorePublish)
    anonymous = connected(5, ANONYMOUS)
    assert anonymous.conn.principal_changed(device()) == []  # nothing to drop
