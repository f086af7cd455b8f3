"""The open-file limit (RLIMIT_NOFILE) of the local cluster's processes, and what it allows.

Every MQTT connection through HAProxy holds two file descriptors in HAProxy: one to the client
and one to the ingest node. With a soft limit of 20,000, HAProxy works out a ``maxconn``
near 10,000 by itself. It then refuses further clients, and nothing in the cluster says
why. So ``cormorant up`` raises its own limit before it starts anything; the processes it
starts inherit the raised limit (:func:`raise_limit`). Run as root (or with
CAP_SYS_RESOURCE) it raises the hard limit too, to what the settings' connections need
(:func:`target_open_files`, at most ``fs.nr_open``); otherwise only the soft limit, up to
the hard one. HAProxy's ``maxconn`` is then written from that limit
(:func:`haproxy_maxconn`), and ``cormorant status`` reports the ceiling HAProxy actually
runs with.
"""

from __future__ import annotations

import resource
from pathlib import Path

RESERVED_DESCRIPTORS = 100
"""Descriptors HAProxy keeps for other uses: listeners, the stats socket, health checks,
logs."""

NR_OPEN = Path("/proc/sys/fs/nr_open")
"""The kernel's ceiling on any process's open-file limit (Linux)."""


def target_open_files(ingest_nodes: int, max_connections: int) -> int:
    """The open-file limit HAProxy needs to take every connection the ingest nodes allow:
    two descriptors per connection for ``ingest_nodes`` x ``max_connections`` (setting
    ``max_connections``, per node), plus :data:`RESERVED_DESCRIPTORS`."""
    return 2 * ingest_nodes * max_connections + RESERVED_DESCRIPTORS


def kernel_ceiling() -> int | None:
    """``fs.nr_open``: the highest open-file limit the kernel grants (None where it cannot be
    read, outside Linux)."""
    try:
        return int(NR_OPEN.read_bytes())
    except (OSError, ValueError):
        return None


def raise_limit(target: int) -> int:
    """Raise this process's RLIMIT_NOFILE towards ``target`` descriptors; return the soft
    limit now.

    The hard limit is raised to ``target`` (at most ``fs.nr_open``) where the kernel allows
    it (root, CAP_SYS_RESOURCE); it is never lowered. Otherwise the soft limit is raised to
    the hard limit (:func:`raise_soft_limit`). Processes started afterwards inherit the
    raised limit. Raises nothing: what the kernel refuses stays as it was.
    """
    ceiling = kernel_ceiling()
    wanted = target if ceiling is None else min(target, ceiling)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        except (ValueError, OSError):
            pass  # not privileged: the hard limit stays, the soft one goes up to it
        else:
            return wanted
    return raise_soft_limit()


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
