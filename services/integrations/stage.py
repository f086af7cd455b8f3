"""The integrations stage: follows the integrations stored in PostgreSQL and runs one
:class:`IntegrationRunner` per enabled integration (docs/integrations/index.md).

Each runner reads ``msg.all`` (committed records only; and ``client.events`` when its Kafka
sink has an events stream, :meth:`~services.integrations.matching.Matcher.events_of`, each
of its partitions in transactions of its own too) in a consumer group of its own,
``<prefix>cormorant-integrations.<integration id>``: an integration's position, lag and
failures are its own, a sink that is down holds up nobody else, and more stage instances
share each integration's partitions. A new integration (or one whose sink cluster holds no
position yet) starts with the first message accepted at or after the time it was last
changed (``updated_at``), found by Kafka's time index: the same start every time it is
asked, so a failure before the first commit neither skips nor repeats anything.

Each kind runs its own way. A Kafka sink: the records of each partition are matched and
formatted (:mod:`.matching`) and written by the sink inside that partition's transaction
with its next offset
(:mod:`.kafka_sink`), by :func:`~services.common.kafka.consumer.consume_in_transactions`:
a failed write or commit aborts the transaction, and the partition is read again from the
offset stored with the sink after a second (counted as retried). The sinks that cannot
join a Kafka transaction (the webhook; the MQTT bridge) are delivered at least once by
their :class:`~.at_least_once.Deliverer` (:data:`DELIVERERS`), offsets committed in the
integration's group after delivery (:mod:`.at_least_once`). Any change of an
integration (announced by PostgreSQL, :mod:`services.common.integrations.store`) restarts
its runner with the new definition; a disabled or deleted one is stopped.

Each runner's counters, state (:class:`~services.common.integrations.status.RunnerState`)
and last error's text (without secrets, :func:`~services.common.integrations.status.
error_text`) are served in ``/metrics`` (:meth:`IntegrationsStage.families`), where
Prometheus and the admin service (its API's and console's integration status) read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Collection, Iterable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from services.common import metrics
from services.common.integrations.model import Integration, IntegrationError, IntegrationKind
from services.common.integrations.status import RunnerState, error_text, secret_values
from services.common.integrations.store import IntegrationStore
from services.common.kafka.consumer import (
    Record,
    Transaction,
    consume_in_transactions,
    make_consumer,
)
from services.common.kafka.names import TopicNames
from services.common.settings import Settings
from services.common.stores.base import StoreUnavailable
from services.common.web import Readiness
from services.integrations.at_least_once import MakeDeliverer, consume_at_least_once
from services.integrations.kafka_sink import KafkaSinkWriter
from services.integrations.matching import Matcher
from services.integrations.mqtt_bridge import MqttBridgeDeliverer
from services.integrations.webhook import WebhookDeliverer

log = logging.getLogger(__name__)

#: Most ``msg.all`` records handled as one batch.
BATCH_MAX = 2000

#: Seconds a transaction may stay open while records keep coming (when none are waiting it
#: commits at once): what a message may wait under load before the sink's readers see it.
TRANSACTION_SECONDS = 0.2

#: Seconds before loading the integrations again after PostgreSQL failed to answer.
RELOAD_BACKOFF_SECONDS = 1.0

#: Seconds before a failed runner starts again, the first time and at most.
RESTART_MIN_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0

#: Seconds a runner may take to stop (its open transactions are then left to the fence).
STOP_SECONDS = 10.0

#: Seconds an at-least-once round (deliver, then commit) may take before the consumer
#: group takes the runner for stuck and gives its partitions to another member.
ROUND_SECONDS_MAX = 3600

#: Characters of a failure's description kept as an integration's last error.
ERROR_TEXT_MAX = 300

DELIVERERS: dict[IntegrationKind, MakeDeliverer] = {
    IntegrationKind.WEBHOOK: WebhookDeliverer,
    IntegrationKind.MQTT: MqttBridgeDeliverer,
}
"""The :class:`~.at_least_once.Deliverer` of each kind delivered at least once."""


class IntegrationCounters:
    """What one integration's runner did: messages written (their transaction committed;
    delivered), failed (their transaction aborted, or no Kafka topic name for them; a
    failed delivery attempt), written again after a failure, set aside in the dead-letter
    topic (:mod:`.webhook`), when the last failure was (Unix seconds) and what it was (its
    text, one line, without secrets), the records not handled yet, and what the runner is
    doing now."""

    def __init__(self) -> None:
        self.sent = 0
        self.failed = 0
        self.retried = 0
        self.dead_lettered = 0
        self.last_error_at: float | None = None
        self.last_error: str | None = None
        self.lag = 0
        self.state = RunnerState.STARTING
        # Messages handled in each partition's open transaction, and the partitions whose
        # last transaction failed: what they write next is written again.
        self.pending: dict[TopicPartition, int] = {}
        self.retrying: set[TopicPartition] = set()

    def handled(self, tp: TopicPartition, messages: int) -> None:
        """``messages`` of partition ``tp`` went into its open transaction."""
        self.pending[tp] = self.pending.get(tp, 0) + messages
        if tp in self.retrying and messages:
            self.retried += messages
            self.retrying.discard(tp)

    def error(self, text: str) -> None:
        """A failure happened now; ``text`` says what (no secret in it:
        :func:`~services.common.integrations.status.error_text`)."""
        self.last_error_at = time.time()
        self.last_error = text

    def unwritable(self, messages: int) -> None:
        """``messages`` were matched but cannot be written (logged by the matcher)."""
        if messages:
            self.failed += messages
            self.error(f"{messages} message(s) skipped: the topic template renders no topic name")

    def ended(
        self, committed: Mapping[TopicPartition, int], aborted: Collection[TopicPartition]
    ) -> None:
        """Transactions committed (``committed``) or aborted (``aborted``): the consume
        loop's :data:`~services.common.kafka.consumer.CommitHook` (the runner records why
        they were aborted)."""
        for tp in committed:
            self.sent += self.pending.pop(tp, 0)
            self.retrying.discard(tp)
        for tp in aborted:
            lost = self.pending.pop(tp, 0)
            self.failed += lost
            self.retrying.add(tp)
            self.last_error_at = time.time()


class IntegrationRunner:
    """Runs one enabled ``integration``: its consumer group on ``msg.all``, its sink, its
    counters. :meth:`run` until cancelled: a Kafka sink in transactions, another kind
    through its :data:`DELIVERERS` entry, at least once."""

    def __init__(self, settings: Settings, integration: Integration, group_prefix: str) -> None:
        self.settings = settings
        self.integration = integration
        self.group = f"{group_prefix}.{integration.id}"
        self.matcher = Matcher(integration)
        self.counters = IntegrationCounters()
        self.consumer: AIOKafkaConsumer | None = None
        self.done: dict[TopicPartition, int] = {}

    async def run(self) -> None:
        """Export until cancelled. When the runner fails (its sink cluster or Kafka
        unreachable, a login refused), it is logged and started again after a backoff that
        doubles from :data:`RESTART_MIN_SECONDS` to :data:`RESTART_MAX_SECONDS` (an
        integration pointing nowhere costs little): only cancellation ends it."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(Exception),
            wait=wait_exponential(min=RESTART_MIN_SECONDS, max=RESTART_MAX_SECONDS),
            before_sleep=self._failed,
        )
        async for attempt in retrying:
            with attempt:
                await self._run_once()

    def _failed(self, state: RetryCallState) -> None:
        """Log why the runner stopped, and when it starts again; it is restarting."""
        error = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        self.counters.state = RunnerState.RESTARTING
        if error is not None:
            self.failure(error)
        log.warning(
            "integration %s stopped: %s; again in %.0f s",
            self.integration.name,
            self.counters.last_error,
            wait,
        )

    def failure(self, error: BaseException) -> None:
        """Record ``error`` as the runner's last error (its text without the
        integration's secrets)."""
        self.counters.error(error_text(error, secret_values(self.integration)))

    async def _run_once(self) -> None:
        if self.integration.kind is IntegrationKind.KAFKA:
            await self._run_kafka()
        else:
            await self._run_at_least_once()

    async def _run_at_least_once(self) -> None:
        """Deliver through the kind's :class:`~.at_least_once.Deliverer` until cancelled
        or it fails (raised)."""
        settings = self.settings
        make = DELIVERERS.get(self.integration.kind)
        if make is None:
            raise IntegrationError(f"no sink for kind {self.integration.kind.value!r} yet")
        deliverer = make(settings, self.integration, self.counters)
        # A round may outlast the default 5 minutes between two fetches while a sink is
        # failing (a webhook's retries); the member must stay in the group meanwhile.
        consumer = make_consumer(
            settings, group_id=self.group, max_poll_interval_ms=ROUND_SECONDS_MAX * 1000
        )
        self.consumer = consumer
        try:
            await deliverer.start()
            await consumer.start()
            await consume_at_least_once(
                consumer,
                TopicNames.from_settings(settings).msg_all,
                self.matcher,
                deliverer,
                self.counters,
                lambda tp: self.first_offset(consumer, tp),
                self.done,
            )
        finally:
            self.consumer = None
            with contextlib.suppress(Exception):
                await consumer.stop()
            with contextlib.suppress(Exception):
                await deliverer.close()

    async def _run_kafka(self) -> None:
        settings = self.settings
        names = TopicNames.from_settings(settings)
        sink = KafkaSinkWriter(settings, self.integration, self.group)
        topics = [names.msg_all]
        if sink.sink.events_topic is not None:
            topics.append(names.client_events)
        self.counters.state = RunnerState.STARTING
        consumer = make_consumer(settings, group_id=self.group)
        self.consumer = consumer
        try:
            await sink.start()
            await consumer.start()
            self.counters.state = RunnerState.RUNNING
            await consume_in_transactions(
                consumer,
                lambda records, transaction: self.handle(sink, records, transaction),
                sink.transactions,
                topics=topics,
                max_records=BATCH_MAX,
                commit_interval=TRANSACTION_SECONDS,
                stage=f"integrations:{self.integration.name}",
                committed_offset=lambda tp: self.start_offset(sink, consumer, tp),
                on_commit=self.ended,
            )
        finally:
            self.consumer = None
            with contextlib.suppress(Exception):
                await consumer.stop()
            with contextlib.suppress(Exception):
                await sink.close()

    async def handle(
        self, sink: KafkaSinkWriter, records: list[Record], transaction: Transaction
    ) -> Sequence[Awaitable[object]]:
        """Write the messages of one partition's ``records`` the integration takes (of a
        ``client.events`` partition: its lifecycle events) in the partition's open
        ``transaction``; returns their acknowledgements."""
        tp = TopicPartition(records[0].topic, records[0].partition)
        if tp.topic == TopicNames.from_settings(self.settings).client_events:
            messages = self.matcher.events_of(records)
        else:
            messages = self.matcher.outgoing_of(records)
        self.counters.unwritable(self.matcher.take_unwritable())
        if self.settings.integrations_commit_delay_seconds > 0:
            transaction.before_commit(self._delay_commit)
        acks = await sink.send(transaction.producer, messages)
        self.counters.handled(tp, len(messages))
        return acks

    async def _delay_commit(self) -> None:
        """Hold the transaction open (``integrations_commit_delay_seconds``, for tests
        that kill the stage between produce and commit)."""
        await asyncio.sleep(self.settings.integrations_commit_delay_seconds)

    def ended(
        self,
        committed: Mapping[TopicPartition, int],
        aborted: Mapping[TopicPartition, BaseException],
    ) -> None:
        """Count the transactions that ended, and why the last aborted one was; remember
        where each partition stands."""
        self.counters.ended(committed, aborted)
        for error in aborted.values():
            self.failure(error)
        self.done.update(committed)

    async def start_offset(
        self, sink: KafkaSinkWriter, consumer: AIOKafkaConsumer, tp: TopicPartition
    ) -> int | None:
        """Where ``tp`` is read again from: the offset committed with the sink's
        transactions, else the first record at or after the integration's ``updated_at``
        (the end of the partition when there is none yet)."""
        offset = await sink.committed(tp)
        if offset is None:
            offset = await self.first_offset(consumer, tp)
        self.done[tp] = offset
        return offset

    async def first_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition) -> int:
        """Where a sink with no stored position starts reading ``tp``: the first record at
        or after the integration's ``updated_at`` (the end of the partition when there is
        none yet)."""
        since = self.integration.updated_at or self.integration.created_at
        at_ms = 0 if since is None else int(since.timestamp() * 1000)
        found = (await consumer.offsets_for_times({tp: at_ms})).get(tp)
        if found is not None:
            return int(found.offset)
        return int((await consumer.end_offsets([tp]))[tp])

    def refresh_lag(self) -> None:
        """Bring the lag up to date: per assigned partition, its high watermark (from the
        last fetch) minus the offset last committed with the sink."""
        consumer = self.consumer
        if consumer is None:
            return
        lag = 0
        for tp in consumer.assignment():
            end = consumer.highwater(tp)
            done = self.done.get(tp)
            if end is not None and done is not None:
                lag += max(0, end - done)
        self.counters.lag = lag


class IntegrationsStage:
    """The stage: loads the enabled integrations whenever PostgreSQL announces a change
    (and at start and after each reconnect) and keeps one running
    :class:`IntegrationRunner` per enabled integration, restarted when its revision
    changes. ``readiness`` says serving once the integrations were first loaded."""

    def __init__(self, settings: Settings, readiness: Readiness, group_prefix: str) -> None:
        self.settings = settings
        self.readiness = readiness
        self.group_prefix = group_prefix
        self.store = IntegrationStore.from_settings(settings)
        self.runners: dict[str, tuple[IntegrationRunner, asyncio.Task[None]]] = {}
        self.changed = asyncio.Event()
        # Counters of integrations stopped since the process started: kept so that their
        # counters do not go back to zero when an integration is changed and restarted.
        self.counters: dict[str, IntegrationCounters] = {}
        metrics.register(self.families)
        metrics.on_scrape(self.refresh_lag)

    async def run(self) -> None:
        """Follow the integrations until cancelled; ready (beside the first load) while
        the broker's Kafka answers metadata requests."""
        probe = make_consumer(self.settings, group_id=None)
        await probe.start()
        self.readiness.add("kafka", probe.topics)
        listening = asyncio.create_task(self.store.listen(self.changed.set))
        first = True
        try:
            while True:
                await self.changed.wait()
                self.changed.clear()
                try:
                    integrations = await self.store.enabled()
                except StoreUnavailable as exc:
                    log.warning("integrations not loaded: %s", exc)
                    await asyncio.sleep(RELOAD_BACKOFF_SECONDS)
                    self.changed.set()
                    continue
                await self.apply(integrations)
                if first:
                    self.readiness.serving(f"integrations ({len(integrations)} enabled)")
                    first = False
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)
            await self.apply([])
            await self.store.close()
            await probe.stop()

    async def apply(self, integrations: Iterable[Integration]) -> None:
        """Run exactly ``integrations``: start the new ones, restart the changed ones,
        stop the others."""
        wanted = {integration.name: integration for integration in integrations}
        stop = [
            name
            for name, (runner, _) in self.runners.items()
            if name not in wanted
            or wanted[name].revision != runner.integration.revision
            or wanted[name].id != runner.integration.id
        ]
        for name in stop:
            runner, task = self.runners.pop(name)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), STOP_SECONDS)
            log.info("integration %s stopped", name)
        for name, integration in wanted.items():
            if name in self.runners:
                continue
            runner = IntegrationRunner(self.settings, integration, self.group_prefix)
            runner.counters = self.counters.setdefault(integration.name, runner.counters)
            task = asyncio.create_task(runner.run(), name=f"integration-{name}")
            self.runners[name] = (runner, task)
            log.info("integration %s started (revision %d)", name, integration.revision)
        for name in set(self.counters) - set(wanted):
            del self.counters[name]

    async def refresh_lag(self) -> None:
        """Update every runner's lag (before a scrape)."""
        for runner, _ in self.runners.values():
            runner.refresh_lag()

    def families(self) -> Iterable[Metric]:
        """The per-integration families of the integrations running here
        (:func:`integration_families`)."""
        return integration_families(self.counters)


def integration_families(counters: Mapping[str, IntegrationCounters]) -> Iterable[Metric]:
    """The per-integration families (label ``integration``: its name) of ``counters``
    (integration name → its counters)."""
    sent = CounterMetricFamily(
        "cormorant_integration_messages_sent",
        "Messages an integration's sink wrote (for the Kafka sink: in a committed "
        "transaction; for a webhook: answered with a 2xx status).",
        labels=["integration"],
    )
    failed = CounterMetricFamily(
        "cormorant_integration_messages_failed",
        "Messages an integration's sink failed to write (an aborted transaction, a "
        "failed webhook attempt: they are written again), or that it cannot write "
        "(logged and skipped).",
        labels=["integration"],
    )
    retried = CounterMetricFamily(
        "cormorant_integration_messages_retried",
        "Messages an integration's sink wrote again after a failed write.",
        labels=["integration"],
    )
    dead_lettered = CounterMetricFamily(
        "cormorant_integration_messages_dead_lettered",
        "Messages an integration's sink gave up on after its attempts and wrote to the "
        "dead-letter topic instead (webhooks).",
        labels=["integration"],
    )
    lag = GaugeMetricFamily(
        "cormorant_integration_lag_records",
        "msg.all records (and client.events records, with an events stream) an "
        "integration has not written yet (high watermark minus the offset committed with "
        "its sink, or in its group when delivered at least once), over the partitions "
        "this instance reads.",
        labels=["integration"],
    )
    last_error = GaugeMetricFamily(
        "cormorant_integration_last_error_timestamp_seconds",
        "Unix time of an integration's last failure (0: none since the process started).",
        labels=["integration"],
    )
    error_info = GaugeMetricFamily(
        "cormorant_integration_last_error_info",
        "An integration's last failure in words (label error: its type and message, "
        "at most 200 characters, secrets replaced by ***); the value is its Unix time. "
        "No series until a failure.",
        labels=["integration", "error"],
    )
    state = GaugeMetricFamily(
        "cormorant_integration_state",
        "What an integration's runner in this process is doing: 1 for its state "
        "(starting, running, restarting after a failure), 0 for the others.",
        labels=["integration", "state"],
    )
    for name, mine in sorted(counters.items()):
        sent.add_metric([name], mine.sent)
        failed.add_metric([name], mine.failed)
        retried.add_metric([name], mine.retried)
        dead_lettered.add_metric([name], mine.dead_lettered)
        lag.add_metric([name], mine.lag)
        last_error.add_metric([name], mine.last_error_at or 0)
        if mine.last_error is not None and mine.last_error_at is not None:
            error_info.add_metric([name, mine.last_error], mine.last_error_at)
        for known in RunnerState:
            state.add_metric([name, known.value], 1 if mine.state is known else 0)
    yield from (sent, failed, retried, dead_lettered, lag, last_error, error_info, state)
