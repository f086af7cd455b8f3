"""Readiness signalling between a service and whoever started it (the local cluster launcher).

A service calls :func:`mark_ready` once it really serves (Kafka answered, state restored,
listener bound) and :func:`clear_ready` when it stops; the launcher waits for the file with
a deadline instead of sleeping.
"""

from __future__ import annotations

import os
from pathlib import Path


def mark_ready(path: Path | None, detail: str = "") -> None:
    """Atomically write the ready file ``path`` (no-op when None) holding ``pid detail``."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(f"{os.getpid()} {detail}\n", encoding="utf-8")
    tmp.replace(path)


def clear_ready(path: Path | None) -> None:
    """Remove the ready file ``path`` if it exists (no-op when None)."""
    if path is not None:
        path.unlink(missing_ok=True)
