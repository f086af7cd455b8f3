"""The hand-made seeds of the stored corpus: ``python -m tests.fuzz.seeds`` writes them.

Each seed is a client session as bytes (encoded with the project's codec): a CONNECT of
each version with its options (Will, credentials, v5 properties, enhanced authentication),
then the packets a client sends after it. For the ``decoder`` and ``connect`` targets a
seed starts with one byte choosing the slice size; ``connection`` reads its operations
from the bytes (atheris' FuzzedDataProvider), so the same sessions only give it a start.
The fuzzer grows the corpus from these (tests/fuzz/README.md).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from services.common.mqtt.codec import encode
from services.common.mqtt.packets import (
    Auth,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    SubscriptionRequest,
    Unsubscribe,
    Will,
)
from services.common.mqtt.properties import Properties
from tests.fuzz.targets import TARGETS

CORPUS = Path(__file__).parent / "corpus"


def _after_connect(version: int) -> list[Packet]:
    v5 = version == 5
    props = Properties(message_expiry_interval=60, topic_alias=1) if v5 else Properties()
    return [
        Subscribe(1, [SubscriptionRequest("a/+/c", 1), SubscriptionRequest("$share/g/#", 2)]),
        Publish("a/b/c", b"hello", 1, packet_id=2, properties=props),
        Publish("a/b/c", b"x", 2, retain=True, packet_id=3),
        PubRel(3),
        PubAck(7),
        PubRec(8),
        PubComp(9),
        PingReq(),
        Unsubscribe(4, ["a/+/c"]),
        Disconnect(0x04 if v5 else 0),
    ]


def sessions() -> list[list[Packet]]:
    """Client sessions, each a list of packets starting with its CONNECT."""
    will = Will("status/c1", b"gone", 1, True)
    v5_will = Will("status/c1", b"gone", 1, False, Properties(will_delay_interval=5))
    auth = Properties(authentication_method="SCRAM-SHA-256", authentication_data=b"n,,n=u,r=x")
    return [
        [Connect(4, "c1", True, 30), *_after_connect(4)],
        [Connect(3, "c1", False, 0, username="u", password=b"p", will=will), *_after_connect(3)],
        [
            Connect(
                5,
                "",
                False,
                10,
                username="u",
                password=b"secret",
                will=v5_will,
                properties=Properties(session_expiry_interval=3600, receive_maximum=2),
            ),
            *_after_connect(5),
        ],
        [Connect(5, "c2", True, 60, properties=auth), Auth(0x18, auth), *_after_connect(5)],
    ]


def write() -> list[Path]:
    """Write the seeds into every target's corpus directory; return the files written."""
    written = []
    for session in sessions():
        version = session[0].protocol_version if isinstance(session[0], Connect) else 5
        stream = b"".join(encode(packet, version) for packet in session)
        for slice_size in (0, 7, 63):  # whole packets, and slices across packet boundaries
            data = bytes([slice_size]) + stream
            for name in TARGETS:
                path = CORPUS / name / f"seed-{hashlib.sha1(data).hexdigest()}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                written.append(path)
    return written


if __name__ == "__main__":
    print(f"{len(write())} seed files written under {CORPUS}")
