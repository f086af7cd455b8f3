"""The PNG chart of one comparison (matplotlib, headless Agg backend).

Traffic scenarios: end-to-end latency p50/p95/p99 in ms (log scale) and published /
delivered msg/s. Connections: connects/s and resident KiB per connection. Bars are the
medians over rounds; dots are the individual rounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.results import flatten, medians


def _values(records: Sequence[Mapping[str, Any]], broker: str, key: str) -> list[float]:
    out = []
    for rec in records:
        if rec["broker"] == broker:
            value = flatten(rec["report"]).get(key)
            if isinstance(value, int | float):
                out.append(float(value))
    return out


def draw(records: Sequence[Mapping[str, Any]], path: Path, brokers: tuple[str, str]) -> Path:
    """Write the chart of ``records`` (one label) to ``path``: a bar per name in
    ``brokers`` (the records' ``broker``: both brokers, or broker and transport series).

    Raises:
        ImportError: matplotlib is not installed (``pip install -e '.[bench]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = records[0]["label"]
    if records[0]["scenario"] == "connections":
        panels = [
            ("connects/s", [("connects_per_s", "connects/s")], False),
            ("KiB per connection", [("memory_per_connection_kib", "RSS/conn")], False),
        ]
    else:
        panels = [
            (
                "end-to-end latency, ms",
                [(f"latency_ms.{p}", p) for p in ("p50", "p95", "p99")],
                True,
            ),
            (
                "throughput, msg/s",
                [("published_per_s", "published"), ("delivered_per_s", "delivered")],
                False,
            ),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (title, keys, log) in zip(axes, panels, strict=True):
        width = 0.8 / len(brokers)
        for b_index, broker in enumerate(brokers):
            med = medians(records, broker)
            xs = [
                k_index + (b_index - (len(brokers) - 1) / 2) * width for k_index in range(len(keys))
            ]
            heights = [med.get(key) or 0.0 for key, _ in keys]
            ax.bar(xs, heights, width, label=broker, color=f"C{b_index % 10}")
            for x, (key, _) in zip(xs, keys, strict=True):
                points = _values(records, broker, key)
                ax.scatter([x] * len(points), points, color="black", s=8, zorder=3)
        ax.set_xticks(range(len(keys)), [name for _, name in keys])
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"{label}: medians of {max(r['round'] for r in records)} rounds")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
