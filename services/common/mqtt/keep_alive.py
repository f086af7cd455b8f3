"""How long a client may stay silent, and what that asks of a load balancer in front.

MQTT 3.1.1 and 5.0 section 3.1.2.10: if the server receives no control packet from the
client within one and a half times the Keep Alive, it closes the connection. A load balancer
that forgets an idle flow sooner than that cuts clients the broker still counts as alive, so
its idle timeout bounds the Keep Alive the broker may grant (``max_keep_alive``; v5 clients
are told with Server Keep Alive).
"""

from __future__ import annotations

import math

GRACE_FACTOR = 1.5
"""A client is gone after ``GRACE_FACTOR`` times its Keep Alive seconds of silence (3.1.2.10)."""

IDLE_MARGIN_SECONDS = 5.0
"""Slack for a PINGREQ in flight and clock granularity between broker and load balancer."""


def silence_allowed(keep_alive: int) -> float:
    """Seconds of silence after which a client with ``keep_alive`` (seconds, > 0) is gone."""
    return keep_alive * GRACE_FACTOR


def max_keep_alive_for_idle_timeout(idle_timeout_seconds: float) -> int:
    """The largest Keep Alive (seconds) whose allowed silence, plus
    :data:`IDLE_MARGIN_SECONDS`, fits within a load balancer's idle timeout (seconds).

    An AWS NLB TLS listener forgets a flow after 350 s: ``(350 - 5) / 1.5`` → 230 s.
    Raises ``ValueError`` when the timeout leaves no room for any Keep Alive.
    """
    allowed = math.floor((idle_timeout_seconds - IDLE_MARGIN_SECONDS) / GRACE_FACTOR)
    if allowed < 1:
        raise ValueError(f"an idle timeout of {idle_timeout_seconds} s allows no keep alive")
    return allowed
