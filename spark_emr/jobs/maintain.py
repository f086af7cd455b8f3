"""Maintenance of the Iceberg archive (:func:`spark_emr.jobs.archive.maintain`): retention by
deleting the partitions older than ``--keep-days``, compaction of the streaming runs' small
files, expiry of the snapshots older than ``--expire-hours`` (their files with them).

Runs as ``spark-submit maintain.py --iceberg glue_catalog.<database> …`` (EMR) or through
``cormorant analytics maintain``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta

from pyspark.sql import SparkSession

from spark_emr.jobs.archive import maintain

#: Snapshots younger than this are kept by default (a reader's query started before the
#: maintenance still finds its files; time travel over the last day).
EXPIRE_HOURS = 24


def cutoffs(
    keep_days: int | None, expire_hours: float, now: datetime | None = None
) -> tuple[date | None, datetime]:
    """(first date kept, or None to keep everything; snapshots expire before this naive
    UTC time) for ``keep_days`` days of data and ``expire_hours`` of snapshots."""
    now = now or datetime.now(UTC).replace(tzinfo=None)
    keep = None if keep_days is None else (now - timedelta(days=keep_days)).date()
    return keep, now - timedelta(hours=expire_hours)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="maintain.py", description=__doc__.splitlines()[0])
    parser.add_argument("--iceberg", required=True, help="catalog.namespace of the tables")
    parser.add_argument("--keep-days", type=int, help="days of data kept (default: all)")
    parser.add_argument("--expire-hours", type=float, default=EXPIRE_HOURS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``spark-submit`` entry point: maintain, print each table's result as JSON lines."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    spark = SparkSession.builder.appName("cormorant-maintain").getOrCreate()
    keep, expire = cutoffs(args.keep_days, args.expire_hours)
    for result in maintain(spark, args.iceberg, delete_before=keep, expire_before=expire).values():
        print(json.dumps(asdict(result)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
