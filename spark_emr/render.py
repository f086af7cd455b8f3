"""The report as one HTML page a person reads without Spark: ``index.html`` with its charts
embedded (matplotlib PNGs as ``data:`` URIs, nothing fetched at view time) and the head of
every table, from the CSV files and ``summary.json`` the report job wrote.

It runs where the command runs (locally, or after an EMR report is fetched), so the EMR
job itself needs neither matplotlib nor a browser.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers and CI
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import pandas as pd

#: Rows of each table shown in the page (the CSV files have more).
SHOWN_ROWS = 15

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222 }
h1 { margin-bottom: 0 } h2 { border-bottom: 1px solid #ccc; margin-top: 2em }
.meta { color: #666 } .totals { display: flex; flex-wrap: wrap; gap: .6em; margin: 1em 0 }
.totals div { background: #f3f5f8; border-radius: 6px; padding: .5em .9em }
.totals b { display: block; font-size: 1.3em }
.grid { display: grid; grid-template-columns: 1fr 1fr; gap: 1.2em }
figure { margin: 0 } figure img { width: 100% } figcaption { color: #555; font-size: .9em }
table { border-collapse: collapse; font-size: 12.5px; margin: .4em 0 1.2em }
th, td { border-bottom: 1px solid #e3e3e3; padding: 2px 8px; text-align: right }
th:first-child, td:first-child { text-align: left }
.note { background: #fff6d6; padding: .4em .8em; border-radius: 4px }
"""


def _png(draw: Callable[[Any], None], width: float = 5.4, height: float = 3.0) -> str:
    """An <img> with the chart ``draw`` makes on a fresh Axes, as a PNG data URI."""
    fig, ax = plt.subplots(figsize=(width, height), dpi=110)
    try:
        draw(ax)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png")
    finally:
        plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="chart" src="data:image/png;base64,{data}">'


def _figure(title: str, chart: str) -> str:
    return f"<figure>{chart}<figcaption>{html.escape(title)}</figcaption></figure>"


def _table(frame: pd.DataFrame, total: int | None = None) -> str:
    if frame.empty:
        return "<p class=meta>no rows</p>"
    shown = frame.head(SHOWN_ROWS)
    more = (total if total is not None else len(frame)) - len(shown)
    extra = f"<p class=meta>… and {more:,} more rows in the CSV file</p>" if more > 0 else ""
    return str(
        shown.to_html(index=False, border=0, na_rep="", float_format=lambda v: f"{v:,.1f}") + extra
    )


def _bars(
    frame: pd.DataFrame, label: str, value: str, horizontal: bool = False, color: str = "#3b6ea5"
) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        labels = frame[label].astype(str)
        if horizontal:
            ax.barh(labels[::-1], frame[value][::-1], color=color)
            ax.set_xlabel(value)
        else:
            ax.bar(labels, frame[value], color=color)
            ax.set_ylabel(value)
            ax.tick_params(axis="x", rotation=30)

    return draw


def _over_time(
    frame: pd.DataFrame, when: str, value: str, kind: str = "bar"
) -> Callable[[Any], None]:
    """Bars (or a line) of ``value`` over ``when``: up to 48 points as labelled bars, more as
    a line over a date axis."""

    def draw(ax: Any) -> None:
        times = pd.to_datetime(frame[when])
        if len(frame) <= 48:
            labels = times.dt.strftime("%m-%d %H:%M")
            if kind == "bar":
                ax.bar(labels, frame[value], color="#3b6ea5")
            else:
                ax.plot(labels, frame[value], marker="o", color="#3b6ea5")
            ax.tick_params(axis="x", rotation=30)
            for label in ax.get_xticklabels()[:: max(1, len(frame) // 12)]:
                label.set_visible(True)
        else:
            ax.plot(times, frame[value], color="#3b6ea5")
            locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
            ax.xaxis.set_major_locator(locator)
            formatter = mdates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
            ax.xaxis.set_major_formatter(formatter)
        ax.set_ylabel(value)

    return draw


def _latency(frame: pd.DataFrame) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        for stage, rows in frame.groupby("stage"):
            ax.step(
                rows["from_ms"].clip(lower=0.5), rows["messages"], where="post", label=str(stage)
            )
        ax.set_xscale("log")
        ax.set_xlabel("latency from PUBLISH received (ms, bucket start)")
        ax.set_ylabel("messages")
        ax.legend(fontsize=8)

    return draw


def _read(directory: Path, name: str) -> pd.DataFrame:
    path = directory / "csv" / f"{name}.csv"
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame()
    try:
        return pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def render(directory: Path) -> Path:
    """Write ``directory/index.html`` from ``directory/csv/*.csv`` and ``summary.json``;
    return its path. Raises ``FileNotFoundError`` if ``summary.json`` is missing."""
    summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    tables = {name: _read(directory, name) for name in summary["tables"]}
    counts: dict[str, int] = summary["tables"]

    def chart(
        name: str, title: str, make: Callable[[pd.DataFrame], Callable[[Any], None]], **size: float
    ) -> str:
        frame = tables.get(name, pd.DataFrame())
        if frame.empty:
            return _figure(title, "<p class=meta>no data in this range</p>")
        return _figure(title, _png(make(frame), **size))

    span = f"{summary['since'] or 'the beginning'} → {summary['until'] or 'now'} (UTC)"
    totals = [
        ("messages", summary["messages"]),
        ("bytes", summary["bytes"]),
        ("publishers", summary["publishers"]),
        ("topics", summary["topics"]),
        ("connects", summary["connects"]),
        ("disconnects", summary["disconnects"]),
        ("authentication failures", summary["auth_failures"]),
        ("clients seen", summary["clients_seen"]),
        ("undecodable records", summary["undecodable_records"]),
        ("records lost before archiving", summary.get("lost_records", 0)),
    ]
    level1 = tables.get("traffic_by_topic_level", pd.DataFrame())
    deepest = pd.DataFrame()
    if not level1.empty:
        deepest = level1[level1["level"] == level1["level"].max()].head(12)
        level1 = level1[level1["level"] == 1].head(12)
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<title>Cormorant analytics report</title>",
        f"<style>{_CSS}</style></head><body>",
        "<h1>Cormorant analytics report</h1>",
        f"<p class=meta>{html.escape(span)} · generated {html.escape(summary['generated_at'])}</p>",
        "<div class=totals>"
        + "".join(f"<div><b>{value:,}</b>{html.escape(label)}</div>" for label, value in totals)
        + "</div>",
        *[f"<p class=note>{html.escape(note)}</p>" for note in summary.get("notes", [])],
        "<h2>Traffic</h2><div class=grid>",
        chart("traffic_by_hour", "Messages per hour", lambda f: _over_time(f, "hour", "messages")),
        chart("qos_mix", "QoS mix (messages)", lambda f: _bars(f, "qos", "messages")),
        _figure("Top topics, first level", _png(_bars(level1, "topic_prefix", "messages", True)))
        if not level1.empty
        else "",
        _figure("Top topics, full names", _png(_bars(deepest, "topic_prefix", "messages", True)))
        if not deepest.empty
        else "",
        chart(
            "traffic_by_client",
            "Top talkers (messages)",
            lambda f: _bars(f.head(12), "client_id", "messages", True),
        ),
        chart(
            "payload_sizes",
            "Payload sizes (bytes, bucket start)",
            lambda f: _bars(f, "size_from_bytes", "messages"),
        ),
        chart(
            "retained_share",
            "Retained share",
            lambda f: _bars(
                f.assign(kind=f["retain"].map({True: "retained", False: "not retained"})),
                "kind",
                "messages",
            ),
        ),
        "</div>",
        "<h3>Messages and bytes per topic level</h3>",
        _table(
            tables.get("traffic_by_topic_level", pd.DataFrame()),
            counts.get("traffic_by_topic_level"),
        ),
        "<h3>Top talkers</h3>",
        _table(tables.get("traffic_by_client", pd.DataFrame()), counts.get("traffic_by_client")),
        "<h2>Fleet</h2><div class=grid>",
        chart(
            "clients_connected_by_hour",
            "Clients connected per hour",
            lambda f: _over_time(f, "hour", "clients", kind="line"),
        ),
        chart("session_durations", "Session durations", lambda f: _bars(f, "duration", "sessions")),
        chart(
            "disconnect_reasons",
            "Disconnect reasons",
            lambda f: _bars(
                f.assign(label=f["cause"] + " " + f["reason"].fillna("").astype(str)),
                "label",
                "disconnects",
                True,
                "#a5503b",
            ),
        ),
        chart(
            "reconnects_by_minute",
            "Reconnects per minute",
            lambda f: _over_time(f, "minute", "reconnects"),
        ),
        "</div>",
        "<h3>Disconnect reasons</h3>",
        _table(tables.get("disconnect_reasons", pd.DataFrame())),
        "<h3>Protocol versions</h3>",
        _table(tables.get("protocol_versions", pd.DataFrame())),
        "<h3>Authentication failures by client address</h3>",
        _table(tables.get("auth_failures", pd.DataFrame()), counts.get("auth_failures")),
        "<h3>Reconnect storms</h3>",
        _table(
            tables.get("reconnects_by_minute", pd.DataFrame()).query("storm == True")
            if not tables.get("reconnects_by_minute", pd.DataFrame()).empty
            else pd.DataFrame()
        ),
        "<h3>Silent clients</h3>",
        _table(tables.get("silent_clients", pd.DataFrame()), counts.get("silent_clients")),
        "<h2>Delivery</h2><div class=grid>",
        chart("latency_histogram", "Latency distributions per stage", _latency),
        "</div>",
        "<h3>Latency per stage (ms)</h3>",
        _table(tables.get("latency", pd.DataFrame())),
        "<h3>Stored backlog (persistent DEVICE sessions)</h3>",
        _table(tables.get("stored_backlog", pd.DataFrame()), counts.get("stored_backlog")),
        "<h3>Expired before delivery</h3>",
        _table(tables.get("expired", pd.DataFrame()), counts.get("expired")),
        *(
            ["<h2>Gaps: records lost before archiving</h2>", _table(tables["gaps"])]
            if "gaps" in tables
            else []
        ),
        "<p class=meta>Every table in full: csv/*.csv and tables/*/ (Parquet) beside this "
        "page.</p>",
        "</body></html>",
    ]
    index = directory / "index.html"
    index.write_text("\n".join(parts), encoding="utf-8")
    return index
