"""The services' per-record produce path around aiokafka, without Kafka: CPU µs per record.

What every service runs for each record it writes (an ingest node's PUBLISH, the router's
downlink record): ``await send(topic, key, value, headers)`` of
:func:`services.common.faust_app.sender`, then Kafka's answer coming back through the
callbacks on the record's future. aiokafka's producer is replaced by a stand-in whose
``send`` returns a fresh future at once; after each batch of ``--batch`` sends, the
futures are answered (as aiokafka answers a produce response's records) and the loop runs
their callbacks. So the figure is the code around aiokafka only, the part a change of
``sender`` moves: best of ``--repeats`` passes of ``--records`` records, in µs of process
CPU per record. Deterministic enough to compare two trees on a busy machine; run it from
each tree's root (``cd /tmp/base && python /path/to/bench_send_path.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path.cwd()))  # the tree being measured, not an installed copy

from services.common.faust_app import make_app, sender
from services.common.settings import Settings


class StubProducer:
    """Stands in for aiokafka's producer: ``send`` returns a pending future, kept for
    :meth:`answer`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: list[asyncio.Future[Any]] = []

    async def send(self, topic: str, value: Any = None, **_: Any) -> asyncio.Future[Any]:
        """Queue a record: its future, answered by :meth:`answer`."""
        future = self.loop.create_future()
        self.pending.append(future)
        return future

    def answer(self) -> None:
        """Answer every pending record as stored."""
        for future in self.pending:
            future.set_result(None)
        self.pending.clear()


async def measure(records: int, batch: int, repeats: int) -> float:
    """Best of ``repeats`` passes: CPU µs per record sent and answered."""
    with tempfile.TemporaryDirectory() as state:
        settings = Settings(state_dir=Path(state), topic_prefix="bench.")
        app = make_app(settings, "bench")
        stub = StubProducer(asyncio.get_running_loop())
        producer: Any = app.producer
        producer._producer = stub  # what Faust's producer holds once started
        send = sender(app)
        headers = [("m", b"\x01" * 24), ("o", b"\x01" * 17)]
        best = float("inf")
        for _ in range(repeats):
            started = time.process_time()
            for first in range(0, records, batch):
                for index in range(first, min(first + batch, records)):
                    await send("bench.msg.downlink.node1", b"client-%d" % index, b"x" * 64, headers)
                stub.answer()
                await asyncio.sleep(0)  # the answered futures' callbacks run
            best = min(best, (time.process_time() - started) / records * 1e6)
        return best


def main() -> None:
    """Print the figure of the tree in the current directory."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("CORMORANT_SETTINGS_FILE", "/dev/null")
    per_record = asyncio.run(measure(args.records, args.batch, args.repeats))
    print(f"{Path.cwd()}: {per_record:.2f} µs of CPU per record sent and answered")


if __name__ == "__main__":
    main()
