"""The local cluster's open-file limit (services/local/open_files.py) and HAProxy's
``maxconn``, which follows it (issue 22.5)."""

from __future__ import annotations

import resource
import subprocess
import sys

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


def test_haproxy_maxconn_is_two_descriptors_per_connection() -> None:
    assert open_files.haproxy_maxconn(20_000) == 9_950
    assert open_files.haproxy_maxconn(1_048_576) == 524_238
    assert open_files.haproxy_maxconn(50) == 1


def test_haproxy_config_carries_the_maxconn_of_the_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    config = haproxy.render_config(LocalSettings())
    assert f"    maxconn {open_files.haproxy_maxconn(soft)}\n" in config
