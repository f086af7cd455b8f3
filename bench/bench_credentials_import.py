"""How long an import of 10,000 credentials takes (``cormorant credentials import``, the
admin API's ``POST /api/credentials:import``): :func:`services.common.auth.bulk.import_rows`
on a PostgreSQL of its own, without HTTP.

Each round imports ``--rows`` MQTT_BASIC rows of one kind (``no-password``: a client id
alone; ``hashed``: an argon2id ``password_hash`` as an export with secrets holds it;
``clear``: a clear password, hashed on import, one thread per CPU), timed from the rows to
the commit, then deletes them (untimed). Kinds alternate round by round; reported: median,
min and max seconds per kind. The record goes to ``bench/results/credentials_import.jsonl``.

``python bench/bench_credentials_import.py --rounds 3``
``python bench/bench_credentials_import.py --rounds 1 --rows 1000 --kinds clear``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from services.common.auth.bulk import import_rows
from services.common.auth.manage import CredentialAdmin
from services.common.auth.passwords import hash_password
from services.common.auth.store import CredentialStore
from services.local import cluster, postgres
from tests.servers import make_test_settings

RESULTS = Path(__file__).resolve().parent / "results" / "credentials_import.jsonl"
KINDS = ("no-password", "hashed", "clear")


def rows_of(kind: str, count: int, prefix: str, password_hash: str) -> list[dict[str, Any]]:
    """``count`` import rows of ``kind`` named ``prefix-<n>``."""
    rows: list[dict[str, Any]] = []
    for n in range(count):
        row: dict[str, Any] = {
            "name": f"{prefix}-{n}",
            "client_id": f"{prefix}-{n}",
            "rules": [f"allow publish d/{prefix}-{n}/#"],
        }
        if kind == "no-password":
            row["no_password"] = True
        elif kind == "hashed":
            row["password_hash"] = password_hash
        else:
            row["password"] = f"password-of-{n:08d}"
        rows.append(row)
    return rows


async def rounds(dsn: str, kinds: list[str], count: int, repeat: int) -> dict[str, list[float]]:
    """Seconds of each import, by kind."""
    admin = CredentialAdmin(CredentialStore(dsn, timeout=60.0))
    password_hash = hash_password(b"one password for all rows")
    timings: dict[str, list[float]] = {kind: [] for kind in kinds}
    try:
        for _ in range(repeat):
            for kind in kinds:
                prefix = f"bench-{uuid.uuid4().hex[:8]}"
                rows = rows_of(kind, count, prefix, password_hash)
                started = time.perf_counter()
                result = await import_rows(admin, rows)
                timings[kind].append(time.perf_counter() - started)
                assert result.written, result.errors[:3]

                async def delete(conn: Any, prefix: str = prefix) -> None:
                    await conn.execute(
                        "DELETE FROM mqtt_credentials WHERE name LIKE %s", (f"{prefix}-%",)
                    )

                await admin.store.pool.run("bench cleanup", delete, 120.0)
    finally:
        await admin.close()
    return timings


def main() -> None:
    """Run the rounds on a PostgreSQL started for the run, print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=["no-password", "hashed"])
    args = parser.parse_args()
    settings = make_test_settings(Path(tempfile.mkdtemp(prefix="bench-import-")))
    cluster.start_component(settings, postgres.NAME)
    try:
        timings = asyncio.run(rounds(postgres.dsn(settings), args.kinds, args.rows, args.rounds))
    finally:
        cluster.down(settings)
    record = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()} {platform.release()}, cpus={os.cpu_count()}",
        "rows": args.rows,
        "seconds": {
            kind: {
                "median": round(statistics.median(values), 2),
                "min": round(min(values), 2),
                "max": round(max(values), 2),
            }
            for kind, values in timings.items()
        },
    }
    print(json.dumps(record, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    with RESULTS.open("a") as out:
        out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
