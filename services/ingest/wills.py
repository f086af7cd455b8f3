"""Will Messages waiting out their Will Delay Interval on this node: one timer each.

A connection that closes with a delayed Will Message hands it over as a
:class:`~services.ingest.effects.PublishWill`; the timer publishes it when the delay has
passed. A new connection of the client settles it first, as :mod:`services.ingest.will`
decides: one made on this node (:meth:`WillTimers.new_connection`) or on another one, seen
in its ``client.sessions`` record (:meth:`WillTimers.session_record`). At shutdown the
waiting ones are published at once (:meth:`WillTimers.publish_all`). They live in this
process's memory: a node that crashes loses them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.common.records import SessionRecord
from services.ingest import will
from services.ingest.effects import PublishWill, StorePublish, StoreRetained

log = logging.getLogger(__name__)

Publish = Callable[[str, list[StorePublish | StoreRetained]], None]
"""Writes the records of a client's Will Message (nobody waits for them)."""


class WillTimers:
    """The delayed Will Messages of this node's former connections, by client id.

    ``publish`` writes a Will Message's records; ``now_ms`` returns Unix time in ms.
    """

    def __init__(self, publish: Publish, now_ms: Callable[[], int]) -> None:
        self._publish = publish
        self._now_ms = now_ms
        self._waiting: dict[str, tuple[PublishWill, asyncio.TimerHandle]] = {}

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def wait(self, client_id: str, effect: PublishWill) -> None:
        """Start the timer of ``client_id``'s Will Message (its registration settled any
        earlier one: a client has one connection, so one will, at a time)."""
        timer = asyncio.get_running_loop().call_later(
            effect.delay_seconds, self._delay_passed, client_id
        )
        self._waiting[client_id] = (effect, timer)

    def _delay_passed(self, client_id: str) -> None:
        effect, _ = self._waiting.pop(client_id)
        self._publish(client_id, will.published_after_delay(effect, self._now_ms()))

    def new_connection(self, client_id: str, clean_start: bool) -> None:
        """A new connection of ``client_id`` was accepted here: publish or discard its
        waiting Will Message."""
        waiting = self._waiting.pop(client_id, None)
        if waiting is None:
            return
        effect, timer = waiting
        timer.cancel()
        records = will.on_new_connection(effect, clean_start, self._now_ms())
        if records:
            self._publish(client_id, records)
        else:
            log.info("client %r reconnected: its Will Message is not sent", client_id)

    def session_record(self, client_id: str, record: SessionRecord | None, offset: int) -> None:
        """A ``client.sessions`` record of ``client_id`` at ``offset``: a newer connection
        of the client (on another node) settles its waiting Will Message."""
        waiting = self._waiting.get(client_id)
        if (
            waiting is not None
            and record is not None
            and will.settled_by(waiting[0], record, offset)
        ):
            self.new_connection(client_id, record.clean_start)

    def publish_all(self) -> None:
        """Publish every waiting Will Message now (the node shuts down: a session's end
        publishes its Will Message, MQTT-3.1.2-8)."""
        for client_id in list(self._waiting):
            effect, timer = self._waiting.pop(client_id)
            timer.cancel()
            self._publish(client_id, will.published_after_delay(effect, self._now_ms()))
