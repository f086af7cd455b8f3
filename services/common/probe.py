"""The container health check: ``python -m services.common.probe [--admin] [PATH]``.

GETs ``http://127.0.0.1:<http_port><PATH>`` (``/health`` by default; with ``--admin`` the
admin service's ``admin_port``) and exits 0 on a 200 answer within 4 s, 1 otherwise: the
Dockerfile's HEALTHCHECK and the ECS task definitions' health checks run it (the images have
no curl).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

from services.common.settings import Settings

#: Seconds the service may take to answer.
TIMEOUT_SECONDS = 4.0


def probe(url: str) -> bool:
    """Whether ``url`` answers 200 within :data:`TIMEOUT_SECONDS`."""
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def main(argv: list[str]) -> int:
    """Probe as the arguments say; the exit status."""
    admin = "--admin" in argv
    paths = [arg for arg in argv if arg != "--admin"]
    settings = Settings()
    port = settings.admin_port if admin else settings.http_port
    url = f"http://127.0.0.1:{port}{paths[0] if paths else '/health'}"
    if probe(url):
        return 0
    print(f"{url} did not answer 200", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
