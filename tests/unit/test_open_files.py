"""The local cluster's open-file limit (services/local/open_files.py) and HAProxy's
``maxconn``, which follows it (issue 22.5)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from services.local import haproxy, open_files
from services.local.settings import LocalSettings

_CHILD = """
import resource
from services.local import open_files
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
print(open_files.raise_soft_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def test_the_soft_limit_is_raised_to_the_hard_limit() -> None:
    """In a child process (the test's own limit stays as it is): a soft limit of 256 is
    raised to the hard limit, which the processes started afterwards inherit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    answer = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, check=True
    ).stdout.split()
    expected = 256 if hard == resource.RLIM_INFINITY else hard
    assert [int(n) for n in answer] == [expected, expected, hard]


_RAISE = """
import os, resource, sys
from services.local import open_files
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1000))
if sys.argv[2] == "unprivileged" and os.geteuid() == 0:
    os.setuid(65534)
print(open_files.raise_limit(int(sys.argv[1])), *resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def _raise_in_child(target: int, privilege: str) -> list[int]:
    """Soft limit returned, soft and hard limits after ``raise_limit(target)`` in a child
    whose limits start at (256, 1000), run as an unprivileged user if ``privilege`` says so."""
    answer = subprocess.run(
        [sys.executable, "-c", _RAISE, str(target), privilege],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [int(n) for n in answer]


def _may_raise_hard_limits() -> bool:
    """Whether this process has CAP_SYS_RESOURCE (capability 24) in its effective set: root
    in a container may lack it, and then cannot raise a hard limit either."""
    status = Path("/proc/self/status").read_text(encoding="ascii")
    [effective] = [line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")]
    return bool(int(effective, 16) & (1 << 24))


def test_the_privileged_raise_the_hard_limit_to_the_target_capped_by_nr_open() -> None:
    """With CAP_SYS_RESOURCE (root, as a rule) the hard limit goes up to the connections'
    target, at most ``fs.nr_open``; without it the soft limit goes up to the hard one only
    (as an unprivileged user too)."""
    privileged = _may_raise_hard_limits()
    assert _raise_in_child(5_000, "as is") == ([5_000] * 3 if privileged else [1_000] * 3)
    ceiling = open_files.kernel_ceiling()
    assert ceiling is not None
    expected = ceiling if privileged else 1_000
    assert _raise_in_child(ceiling * 2, "as is") == [expected] * 3
    assert _raise_in_child(5_000, "unprivileged") == [1_000] * 3


def test_the_target_holds_two_descriptors_per_allowed_connection() -> None:
    assert open_files.target_open_files(2, 100_000) == 400_100
    assert open_files.haproxy_maxconn(open_files.target_open_files(3, 5_000)) == 15_000


def test_haproxy_maxconn_is_two_descriptors_per_connection() -> None:
    assert open_files.haproxy_maxconn(20_000) == 9_950
    assert open_files.haproxy_maxconn(1_048_576) == 524_238
    assert open_files.haproxy_maxconn(50) == 1


def test_haproxy_config_carries_the_maxconn_of_the_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    config = haproxy.render_config(LocalSettings())
    assert f"    maxconn {open_files.haproxy_maxconn(soft)}\n" in config
