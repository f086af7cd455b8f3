"""The open-file limit (RLIMIT_NOFILE) of the local cluster's processes, and what it allows.

Every MQTT connection through HAProxy holds two file descriptors in HAProxy: one to the client
and one to the ingest node. With a soft limit of 20,000, HAProxy works out a ``maxconn``
near 10,000 by itself. It then refuses further clients, and nothing in the cluster says
why. So ``cormorant up`` raises its own soft limit to the hard limit before it starts
anything; the processes it starts inherit the raised limit. HAProxy's ``maxconn`` is then
written from that limit (:func:`haproxy_maxconn`), and ``cormorant status`` reports the
ceiling HAProxy actually runs with.
"""

from __future__ import annotations

import resource

RESERVED_DESCRIPTORS = 100
"""Descriptors HAProxy keeps for other uses: listeners, the stats socket, health checks,
logs."""


def raise_soft_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the soft limit now.

    Processes started afterwards inherit the raised limit. An unlimited hard limit leaves
    the soft limit as it is: the kernel caps descriptors at ``fs.nr_open`` anyway. Raises
    nothing: if the kernel refuses, the soft limit stays as it was and that value is
    returned.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
        return hard
    return soft


def haproxy_maxconn(soft_limit: int) -> int:
    """HAProxy's ``maxconn`` for a process whose soft open-file limit is ``soft_limit``:
    two descriptors per proxied connection, after :data:`RESERVED_DESCRIPTORS` (at least 1).
    """
    return max(1, (soft_limit - RESERVED_DESCRIPTORS) // 2)
