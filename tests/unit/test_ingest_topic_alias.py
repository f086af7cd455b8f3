"""Server-assigned Topic Aliases on outgoing PUBLISHes (MQTT 5.0 3.3.2.3.4, 3.1.2.11.5):
per connection, within the client's Topic Alias Maximum, least recently used replaced,
only when the client allows them and ``assign_topic_aliases`` is on.
"""

from __future__ import annotations

import pytest
from test_ingest_support import Client, fan_out, make_settings, of_type

from services.common.mqtt.packets import Publish
from services.common.mqtt.properties import Properties
from services.common.records import Target
from services.ingest.effects import Send
from services.ingest.topic_alias import OutboundAliases


def _subscriber(maximum: int | None, version: int = 5, **settings: object) -> Client:
    """A connected client whose CONNECT says Topic Alias Maximum ``maximum`` (None: absent)."""
    client = Client(version, make_settings(**settings))
    props = Properties(topic_alias_maximum=maximum) if version == 5 else None
    client.connect("sub", properties=props)
    return client


def _wire(client: Client, topic: str, qos: int = 0, payload: bytes = b"") -> tuple[str, int | None]:
    """Deliver one message on ``topic``: (Topic Name, Topic Alias) of the PUBLISH sent."""
    effects = client.conn.deliver_routed(fan_out(topic, payload), Target("sub", qos))
    [packet] = of_type(client.packets(effects), Publish)
    return packet.topic, packet.properties.topic_alias


# ---------------------------------------------------------------------- the alias table


def test_aliases_are_handed_out_from_one_and_known_the_second_time() -> None:
    aliases = OutboundAliases(3)
    assert [aliases.choose(t) for t in ("a", "b", "a", "c", "b")] == [
        (1, False),
        (2, False),
        (1, True),
        (3, False),
        (2, True),
    ]
    assert len(aliases) == 3


def test_the_least_recently_used_alias_is_reassigned_at_the_maximum() -> None:
    aliases = OutboundAliases(2)
    aliases.choose("a")
    aliases.choose("b")
    aliases.choose("a")  # b is now the least recently used
    assert aliases.choose("c") == (2, False)
    assert aliases.choose("a") == (1, True)
    assert aliases.choose("b") == (2, False)  # c's alias, c being least recent after a
    assert len(aliases) == 2


def test_a_forgotten_alias_is_handed_out_again() -> None:
    aliases = OutboundAliases(2)
    aliases.choose("a")
    aliases.choose("b")
    aliases.forget("b")
    assert aliases.choose("c") == (2, False)
    aliases.forget("nothing")  # unknown topics are ignored


# ---------------------------------------------------------------------- on the wire


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_the_topic_goes_once_then_only_the_alias(qos: int) -> None:
    client = _subscriber(10)
    assert _wire(client, "a/1", qos) == ("a/1", 1)
    assert _wire(client, "a/1", qos) == ("", 1)
    assert _wire(client, "a/2", qos) == ("a/2", 2)
    assert _wire(client, "a/1", qos) == ("", 1)


def test_past_the_clients_maximum_the_least_recently_used_alias_is_replaced() -> None:
    client = _subscriber(2)
    sent = [_wire(client, t) for t in ("a", "b", "a", "c", "a", "b")]
    assert sent == [("a", 1), ("b", 2), ("", 1), ("c", 2), ("", 1), ("b", 2)]
    assert all(alias is not None and 0 < alias <= 2 for _, alias in sent)  # [MQTT-3.3.2-9]


@pytest.mark.parametrize(
    ("maximum", "version", "settings"),
    [(0, 5, {}), (None, 5, {}), (10, 5, {"assign_topic_aliases": False}), (None, 4, {})],
    ids=["maximum-0", "no-maximum", "setting-off", "v311"],
)
def test_no_alias_unless_the_client_allows_them_and_the_setting_is_on(
    maximum: int | None, version: int, settings: dict[str, object]
) -> None:
    client = _subscriber(maximum, version, **settings)
    assert [_wire(client, "t") for _ in range(2)] == [("t", None), ("t", None)]


def test_a_dropped_publish_does_not_set_up_its_alias() -> None:
    client = Client(5)
    client.connect("sub", properties=Properties(topic_alias_maximum=5, maximum_packet_size=40))
    target = Target("sub", 0)
    assert client.conn.deliver_routed(fan_out("big", b"x" * 60), target) == []  # too large
    assert _wire(client, "big", payload=b"ok") == ("big", 1)  # so the name is sent now


def test_connections_with_the_same_aliases_share_the_encoding() -> None:
    first, second, third = _subscriber(5), _subscriber(5), _subscriber(5)
    _wire(third, "other")  # alias 1 taken by another topic
    message = fan_out("t", b"m")
    sent = [
        of_type(c.conn.deliver_routed(message, Target("sub", 0)), Send)[0].data
        for c in (first, second, third)
    ]
    assert sent[0] is sent[1]
    assert sent[2] != sent[0]
    assert message.encodings == 2
    again = fan_out("t", b"m")
    known = [
        of_type(c.conn.deliver_routed(again, Target("sub", 0)), Send)[0].data
        for c in (first, second)
    ]
    assert known[0] is known[1] and len(known[0]) < len(sent[0])  # no Topic Name any more
