"""The ``client.events`` records an ingest connection writes (services/ingest/events.py),
with bytes alone: what is recorded on connect, subscribe, unsubscribe, refusal and at the
end of a connection, with the cause that ended it."""

from __future__ import annotations

import pytest
from test_ingest_support import CONNECTION_ID, NODE_ID, NOW_MS, Client

from services.common.mqtt.errors import MQTTError
from services.common.mqtt.packets import (
    Disconnect,
    PingReq,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
)
from services.common.mqtt.reason_codes import ReasonCode
from services.common.records import (
    DisconnectCause,
    EventKind,
    EventRecord,
    decode_event,
    encode_event,
)
from services.ingest import handle_connect
from services.ingest.effects import RecordEvent

ADDRESS = "192.0.2.7:50123"


def connected(version: int = 5, keep_alive: int = 30) -> Client:
    client = Client(version)
    client.conn.state.client_address = ADDRESS
    client.connect("dev-1", keep_alive=keep_alive)
    return client


def kinds(client: Client) -> list[EventKind]:
    return [e.event.kind for e in client.events]


def last(client: Client) -> EventRecord:
    return client.events[-1].event


@pytest.mark.parametrize("version", [4, 5])
def test_connack_records_a_connected_event_with_the_connection(version: int) -> None:
    client = connected(version)
    assert client.events == [
        RecordEvent(
            "dev-1",
            EventRecord(
                kind=EventKind.CONNECTED,
                at_ms=NOW_MS,
                node_id=NODE_ID,
                client_address=ADDRESS,
                connection_id=CONNECTION_ID,
                protocol_version=version,
                clean_start=True,
            ),
        )
    ]
    assert decode_event(encode_event(last(client))) == last(client)


def test_client_disconnect_records_its_reason_code_once() -> None:
    client = connected()
    client.send(Disconnect(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    client.lost()
    client.lost()
    assert kinds(client) == [EventKind.CONNECTED, EventKind.DISCONNECTED]
    assert last(client).cause is DisconnectCause.CLIENT_DISCONNECT
    assert last(client).reason_code == ReasonCode.DISCONNECT_WITH_WILL_MESSAGE
    assert last(client).connection_id == CONNECTION_ID


def test_socket_loss_is_connection_lost() -> None:
    client = connected()
    client.lost()
    assert (last(client).kind, last(client).cause) == (
        EventKind.DISCONNECTED,
        DisconnectCause.CONNECTION_LOST,
    )


def test_keep_alive_timeout_is_its_own_cause_not_a_protocol_error() -> None:
    client = connected(keep_alive=10)
    client._keep(client.conn.keep_alive_expired())
    client.lost()
    assert last(client).cause is DisconnectCause.KEEP_ALIVE_TIMEOUT
    assert last(client).reason_code == ReasonCode.KEEP_ALIVE_TIMEOUT


def test_takeover_and_server_shutdown_and_protocol_error() -> None:
    taken = connected()
    taken._keep(taken.conn.taken_over(new_clean_start=True))
    taken.lost()
    assert last(taken).cause is DisconnectCause.TAKEOVER
    assert last(taken).reason_code == ReasonCode.SESSION_TAKEN_OVER

    stopped = connected()
    stopped._keep(stopped.conn.shutting_down())
    stopped.lost()
    assert last(stopped).cause is DisconnectCause.SERVER_SHUTDOWN

    broken = connected()
    broken.send_bytes(b"\xf0\x00")  # AUTH without enhanced authentication (MQTT 4.12)
    broken.lost()
    assert last(broken).cause is DisconnectCause.PROTOCOL_ERROR
    assert last(broken).reason_code == ReasonCode.PROTOCOL_ERROR


def test_subscribe_and_unsubscribe_record_the_accepted_filters() -> None:
    client = connected()
    client.send(Subscribe(1, [SubscriptionRequest("a/+", 1), SubscriptionRequest("bad/#/x", 0)]))
    assert (last(client).kind, last(client).topic_filters) == (
        EventKind.SUBSCRIBED,
        (("a/+", 1),),
    )
    client.send(Unsubscribe(2, ["a/+", "never/subscribed"]))
    assert (last(client).kind, last(client).topic_filters) == (
        EventKind.UNSUBSCRIBED,
        (("a/+", 0),),
    )
    client.send(PingReq())
    assert kinds(client).count(EventKind.SUBSCRIBED) == 1


@pytest.mark.parametrize(
    ("reason", "recorded"),
    [
        (ReasonCode.BAD_USER_NAME_OR_PASSWORD, True),
        (ReasonCode.NOT_AUTHORIZED, True),
        (ReasonCode.BAD_AUTHENTICATION_METHOD, True),
        (ReasonCode.CLIENT_IDENTIFIER_NOT_VALID, False),
    ],
)
def test_a_refusal_for_credentials_is_an_auth_failure(reason: ReasonCode, recorded: bool) -> None:
    client = Client(5)
    client.conn.state.client_address = ADDRESS
    effects = handle_connect.refuse(client.conn.state, MQTTError("refused", reason))
    events = [e.event for e in effects if isinstance(e, RecordEvent)]
    if not recorded:
        assert events == []
        return
    assert [(e.kind, e.reason_code, e.client_address) for e in events] == [
        (EventKind.AUTH_FAILED, reason, ADDRESS)
    ]


def test_a_refused_connection_records_no_disconnect() -> None:
    client = Client(5)
    client.send_bytes(b"\x10\x03\x00\x01M")  # a truncated CONNECT: refused, never accepted
    client.lost()
    assert kinds(client) == []
