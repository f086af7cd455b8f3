"""Wall-clock time as every service stamps and compares it: Unix time in milliseconds.

Message Expiry (MQTT 5.0 3.3.2.3.3), Session Expiry (3.1.2.11.2) and the times in Kafka
records (``PublishMeta.received_at_ms``, ``SessionRecord.updated_at_ms``) all use it. The
sans-IO cores take a ``now_ms`` callable instead of calling it, so tests set the time.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Unix time in milliseconds (wall clock, not monotonic: it is compared across hosts)."""
    return time.time_ns() // 1_000_000
