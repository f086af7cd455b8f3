"""The HTML report as a person sees it: rendered from report tables (no Spark here) and
opened in a real headless Chromium, which must show every chart from the page itself and
fetch nothing else."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from spark_emr.render import render
from tests.browser import chromium

TABLES = {
    "traffic_by_hour": "hour,messages,bytes\n2026-11-23 10:00:00,120,4800\n"
    "2026-11-23 11:00:00,80,3200\n",
    "qos_mix": "qos,messages,bytes\n0,150,6000\n1,50,2000\n",
    "retained_share": "retain,messages,bytes\nFalse,190,7600\nTrue,10,400\n",
    "traffic_by_topic_level": "level,topic_prefix,messages,bytes\n1,plant,200,8000\n"
    "2,plant/line1,120,4800\n2,plant/line2,80,3200\n",
    "traffic_by_client": "client_id,messages,bytes,topics,first_at,last_at\n"
    "press-7,120,4800,1,2026-11-23 10:00:01,2026-11-23 11:59:00\n",
    "payload_sizes": "size_from_bytes,messages\n32,150\n64,50\n",
    "disconnect_reasons": "cause,reason_code,reason,disconnects\n"
    "KEEP_ALIVE_TIMEOUT,141,KEEP_ALIVE_TIMEOUT,3\nCLIENT_DISCONNECT,0,NORMAL_DISCONNECTION,9\n",
    "latency_histogram": "stage,from_ms,messages\nrouted to downlink,10,40\n"
    "routed to downlink,20,10\nacknowledged,50,7\n",
    "latency": "stage,messages,p50_ms,p90_ms,p99_ms,max_ms\nacknowledged,7,55.0,60.0,61.0,61.0\n",
    "auth_failures": "",
}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium, headless, driven by Playwright."""
    with chromium() as found:
        yield found


def _report(directory: Path) -> Path:
    (directory / "csv").mkdir(parents=True)
    for name, text in TABLES.items():
        (directory / "csv" / f"{name}.csv").write_text(text, encoding="utf-8")
    summary = {
        "since": "2026-11-23T10:00:00", "until": None, "generated_at": "2026-11-23T12:00:00",
        "messages": 200, "bytes": 8000, "publishers": 2, "topics": 2,
        "undecodable_records": 0, "connects": 12, "disconnects": 12, "auth_failures": 0,
        "clients_seen": 4, "notes": ["no deliveries archived: delivery tables are empty"],
        "tables": {name: text.count("\n") - 1 for name, text in TABLES.items()},
    }  # fmt: skip
    (directory / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return render(directory)


def test_the_page_shows_its_charts_and_tables_offline(browser: Browser, tmp_path: Path) -> None:
    index = _report(tmp_path)
    page = browser.new_page()
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))
    page.goto(index.as_uri())
    shown = page.evaluate(
        "Array.from(document.images).filter(i => i.complete && i.naturalWidth > 300).length"
    )
    # Every chart with data: traffic, QoS, two of topics, talkers, sizes, retained share,
    # disconnect reasons, latency.
    assert shown == 9
    assert fetched == [index.as_uri()]  # nothing but the page itself
    text = page.inner_text("body")
    assert "2026-11-23T10:00:00 → now (UTC)" in text
    assert "press-7" in text and "NORMAL_DISCONNECTION" in text
    assert "no deliveries archived" in text
    # Charts without data: clients connected, session durations, reconnects.
    assert text.count("no data in this range") == 3
    page.close()
