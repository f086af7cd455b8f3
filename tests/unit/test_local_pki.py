"""The local cluster's PKI made by several threads at once, as the launcher starts the
ingest nodes side by side (:func:`services.local.certificates.ensure_local_pki`)."""

from __future__ import annotations

import threading
from pathlib import Path

from services.local.certificates import ensure_local_pki


def test_threads_asking_for_a_fresh_pki_at_once_all_get_the_same_ca(tmp_path: Path) -> None:
    keys: list[bytes] = []
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            keys.append(ensure_local_pki(tmp_path).ca.key.read_bytes())
        except BaseException as exc:  # a missing ca.key, as the production fixture saw
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(keys) == 8 and len(set(keys)) == 1  # one CA, not one per thread
