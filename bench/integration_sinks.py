"""The receiving ends of ``bench/bench_integrations.py``'s webhook and MQTT bridge runs, each
in a process of its own so that its CPU is not counted as the integrations stage's:

- ``python -m bench.integration_sinks http --port P``: an HTTP endpoint (aiohttp, one
  event loop, no access log) answering every POST with ``200`` and an empty body as fast
  as it can;
- ``python -m bench.integration_sinks mqtt --port P --topic-filter F --qos Q``: an MQTT 5
  subscriber (paho-mqtt) of a broker on 127.0.0.1:P.

Both count the messages they receive (:class:`Tally`; a webhook body's messages by
:func:`webhook_payloads`) and talk to the benchmark over their standard streams, one line
each way: they print ``ready`` once listening (subscribed), then answer each ``tally`` line
on standard input with the tally as one JSON line (:meth:`Tally.snapshot`) and each
``reset <nonce>`` line by starting a new round (and printing ``{}``). End of input ends
them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import threading
from collections.abc import Iterable
from typing import Any

READY = "ready"
"""The line a sink prints once it receives messages."""


class Tally:
    """Messages received in the current round, and how many distinct payloads among them
    (the benchmark makes every payload of a round different and starts each with the
    round's nonce, so ``messages - distinct`` arrived twice and ``expected - distinct`` are
    missing); ``strays``: messages of other rounds (an earlier round's redeliveries). Safe
    to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nonce = b""
        self._messages = 0
        self._strays = 0
        self._seen: set[bytes] = set()

    def add(self, payloads: Iterable[bytes]) -> None:
        """Count the messages whose payloads are ``payloads``."""
        with self._lock:
            for payload in payloads:
                if payload.startswith(self._nonce):
                    self._messages += 1
                    self._seen.add(payload)
                else:
                    self._strays += 1

    def snapshot(self) -> dict[str, int]:
        """``{"messages": received, "distinct": distinct payloads, "strays": of other
        rounds}``."""
        with self._lock:
            return {
                "messages": self._messages,
                "distinct": len(self._seen),
                "strays": self._strays,
            }

    def reset(self, nonce: bytes) -> None:
        """Forget everything received; a new round, whose payloads start with ``nonce``."""
        with self._lock:
            self._nonce = nonce
            self._messages = 0
            self._strays = 0
            self._seen.clear()


def _document_payload(document: dict[str, Any]) -> bytes:
    """The payload bytes of one ``cormorant.message/1`` document (docs/integrations/index.md:
    ``payload`` is UTF-8 text or base64 by ``payload_encoding``). Raises ``KeyError``,
    ``ValueError`` (binascii.Error) on a document that is not one."""
    payload = document["payload"]
    if document["payload_encoding"] == "base64":
        return base64.b64decode(payload, validate=True)
    return str(payload).encode("utf-8")


def webhook_payloads(body: bytes, content_type: str) -> list[bytes]:
    """The payloads of the messages in one webhook request (docs/integrations/webhook.md,
    "Requests"): the body itself for ``application/octet-stream`` (``--format raw``); for
    ``application/json``, one document or a JSON array of them (a batch). Raises
    ``ValueError`` (``json.JSONDecodeError``), ``KeyError`` or ``TypeError`` on a body
    that is none of these."""
    if content_type.split(";")[0].strip() == "application/octet-stream":
        return [body]
    parsed = json.loads(body)
    documents = parsed if isinstance(parsed, list) else [parsed]
    return [_document_payload(document) for document in documents]


def _answer(tally: Tally) -> None:
    """Answer the benchmark's lines on standard input until it closes it."""
    for line in sys.stdin:
        command = line.strip()
        if command == "tally":
            print(json.dumps(tally.snapshot()), flush=True)
        elif command.startswith("reset "):
            tally.reset(command.removeprefix("reset ").encode("utf-8"))
            print("{}", flush=True)


async def _serve_http(port: int, tally: Tally) -> None:
    from aiohttp import web

    async def take(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            tally.add(webhook_payloads(body, request.headers.get("Content-Type", "")))
        except (ValueError, KeyError, TypeError) as exc:
            return web.Response(status=400, text=f"not a webhook body: {exc!r}")
        return web.Response(status=200)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{tail:.*}", take)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(READY, flush=True)
    await asyncio.to_thread(_answer, tally)
    await runner.cleanup()


def _subscribe_mqtt(port: int, topic_filter: str, qos: int, tally: Tally) -> None:
    import paho.mqtt.client as paho
    from paho.mqtt.enums import CallbackAPIVersion

    subscribed = threading.Event()
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id="bench-integrations-sub", protocol=paho.MQTTv5
    )
    client.on_connect = lambda c, *_: c.subscribe(topic_filter, qos)
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_message = lambda _c, _u, message: tally.add([bytes(message.payload)])
    client.connect("127.0.0.1", port)
    client.loop_start()
    if not subscribed.wait(10):
        raise SystemExit(f"no SUBACK from 127.0.0.1:{port}")
    print(READY, flush=True)
    _answer(tally)
    client.disconnect()
    client.loop_stop()


def main() -> None:
    """Run one sink (see the module)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    http = kinds.add_parser("http", help="an HTTP endpoint answering 200")
    http.add_argument("--port", type=int, required=True)
    mqtt = kinds.add_parser("mqtt", help="an MQTT 5 subscriber")
    mqtt.add_argument("--port", type=int, required=True)
    mqtt.add_argument("--topic-filter", required=True)
    mqtt.add_argument("--qos", type=int, choices=(0, 1, 2), default=1)
    args = parser.parse_args()
    tally = Tally()
    if args.kind == "http":
        asyncio.run(_serve_http(args.port, tally))
    else:
        _subscribe_mqtt(args.port, args.topic_filter, args.qos, tally)


if __name__ == "__main__":
    main()
