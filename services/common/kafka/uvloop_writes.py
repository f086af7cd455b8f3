"""aiokafka on uvloop: a write to a connection that just closed is a connection error.

aiokafka's connection (:class:`aiokafka.conn.AIOKafkaConnection`) turns an ``OSError`` from
writing a request into ``KafkaConnectionError``, closes the connection and lets the caller
retry, as asyncio's own transports raise it. uvloop's raise ``RuntimeError`` instead
("unable to perform operation on <TCPTransport closed=True ...>; the handler is closed")
when the peer closed the connection and aiokafka has not noticed yet: the error escapes
every ``except KafkaError`` on the way up (aio-libs/aiokafka#1038, open). When the writer
was a client's metadata synchronizer, that task ends, and every later metadata refresh of
that client waits forever: a consumer group member then never finds its coordinator
again after a Kafka restart, and holds its partitions without reading them (a
device_persist instance did, 2026-11-24, after a Kafka kill -9 under load).

:func:`install` makes that ``RuntimeError`` what an ``OSError`` is there. Called by
:func:`services.common.faust_app.run_worker` when it runs a service on uvloop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from aiokafka.conn import AIOKafkaConnection, CloseReason
from aiokafka.errors import KafkaConnectionError

#: The methods of :class:`~aiokafka.conn.AIOKafkaConnection` that write to its transport.
WRITERS = ("send", "_send_sasl_token")

_INSTALLED = "__cormorant_uvloop_writes__"


def _closed_transport_is_a_connection_error(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def write(self: AIOKafkaConnection, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except RuntimeError as err:
            writer = self._writer
            if writer is not None and not writer.transport.is_closing():
                raise  # not a closed transport: a bug, left as it is
            self.close(reason=CloseReason.CONNECTION_BROKEN)
            raise KafkaConnectionError(
                f"Connection at {self.host}:{self.port} broken: {err}"
            ) from err

    setattr(write, _INSTALLED, True)
    return write


def install() -> None:
    """Wrap :data:`WRITERS` so that a ``RuntimeError`` raised by writing to a closed
    transport closes the connection and raises ``aiokafka.errors.KafkaConnectionError``,
    as an ``OSError`` does. Idempotent; affects every aiokafka connection of the process."""
    for name in WRITERS:
        method = getattr(AIOKafkaConnection, name)
        if not getattr(method, _INSTALLED, False):
            setattr(AIOKafkaConnection, name, _closed_transport_is_a_connection_error(method))
