"""Each integration's status as the integrations stages tell it in their ``/metrics``: what
the admin API's ``GET /api/integrations`` and ``GET /api/integrations/{name}`` show, and
the console's Integrations page (docs/integrations/index.md, "Status and monitoring").

The admin service already probes every service process's ``/metrics`` every two seconds
(:class:`~services.admin.cluster.StatsSampler`, for the console's overview); the status is
read from its latest probes, so the stages need no other channel and the admin service no
other store: the same figures Prometheus scrapes, summed over the stage processes (each
reads its share of an integration's ``msg.all`` partitions).

Which families count is read from their labels, not their names, so a family a sink adds
(the webhook's dead-lettered messages) shows without a change here: every
``cormorant_integration_*`` sample whose only label is ``integration`` is a figure, keyed
by its name without the prefix and without ``_total`` (summed; the ``*_timestamp_seconds``
ones: the latest); one with further labels is keyed ``name{label=value,...}``; the samples
with a ``state`` label are the runners' states, and those with an ``error`` label the last
error's text, its value its Unix time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, cast

from pydantic import BaseModel, Field

from services.admin.cluster import Probe
from services.common.integrations.model import Integration
from services.common.integrations.status import DISABLED, NOT_RUNNING, RunnerState

PREFIX = "cormorant_integration_"
"""The prefix of the per-integration families the stage serves."""

#: Which state an integration shows when its stage processes disagree: the most worrying.
_PRECEDENCE = (RunnerState.RESTARTING, RunnerState.STARTING, RunnerState.RUNNING)

_STATES = frozenset(state.value for state in RunnerState)

State = Literal["starting", "running", "restarting", "disabled", "not running"]


class IntegrationStatus(BaseModel):
    """What the integrations stages say of one integration, as of the admin service's
    last probe of their ``/metrics`` (every 2 s)."""

    state: State = Field(
        description="running; starting (connecting to its sink); restarting (stopped by "
        "an error, starting again after a backoff); disabled; not running (enabled, but "
        "no integrations stage runs it yet)."
    )
    instances: int = Field(description="Stage processes running it.")
    counters: dict[str, float] = Field(
        description="Every cormorant_integration_* figure the stages serve for it, by name "
        "without the prefix and _total, summed over the stage processes (the "
        "*_timestamp_seconds ones: the latest): messages_sent, messages_failed, "
        "messages_retried, lag_records, last_error_timestamp_seconds, and any a sink adds."
    )
    last_error: str | None = Field(
        description="The last error's type and message (at most 200 characters, secrets "
        "replaced by ***); null: none since the stage processes started."
    )
    last_error_at: datetime | None = Field(description="When the last error happened.")


@dataclass
class Reported:
    """What the stage processes reported of one integration."""

    counters: dict[str, float] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)
    last_error: str | None = None
    last_error_at: float = 0.0


def _key(sample: str, labels: Mapping[str, str]) -> str:
    """A figure's key: the sample's name without :data:`PREFIX` and ``_total``, with its
    labels other than ``integration`` in braces."""
    key = sample.removeprefix(PREFIX).removesuffix("_total")
    others = sorted((k, v) for k, v in labels.items() if k != "integration")
    if others:
        key += "{" + ",".join(f"{k}={v}" for k, v in others) + "}"
    return key


def _take(mine: Reported, sample: str, labels: Mapping[str, str], value: float) -> None:
    """Add one sample a stage process served of an integration to what ``mine`` holds."""
    if "state" in labels:
        if value == 1 and labels["state"] in _STATES:
            mine.states.append(labels["state"])
    elif "error" in labels:
        if value >= mine.last_error_at:
            mine.last_error, mine.last_error_at = labels["error"], value
    else:
        key = _key(sample, labels)
        before = mine.counters.get(key)
        if before is None:
            mine.counters[key] = value
        elif key.endswith("_timestamp_seconds"):
            mine.counters[key] = max(before, value)
        else:
            mine.counters[key] = before + value


def reported(probes: Iterable[Probe]) -> dict[str, Reported]:
    """What the processes that answered (``probes``) served of each integration, by name."""
    found: dict[str, Reported] = {}
    for probe in probes:
        if probe.error is not None:
            continue
        for sample, pairs in probe.samples.items():
            if not sample.startswith(PREFIX) or sample.endswith("_created"):
                continue
            for labels, value in pairs:
                name = labels.get("integration")
                if name is not None:
                    _take(found.setdefault(name, Reported()), sample, labels, value)
    return found


def status_of(integration: Integration, found: Mapping[str, Reported]) -> IntegrationStatus:
    """``integration``'s status from what the stages ``found`` (:func:`reported`): disabled
    when it is, else the most worrying state of its runners (restarting, starting,
    running), not running when no stage reports it."""
    mine = found.get(integration.name, Reported())
    state: State
    if not integration.enabled:
        state = DISABLED
    elif not mine.states:
        state = NOT_RUNNING
    else:
        state = cast(State, next(s.value for s in _PRECEDENCE if s.value in mine.states))
    at = mine.last_error_at
    return IntegrationStatus(
        state=state,
        instances=len(mine.states),
        counters=mine.counters,
        last_error=mine.last_error,
        last_error_at=datetime.fromtimestamp(at, UTC) if mine.last_error is not None else None,
    )
