"""The DEVICE store's per-client cap (``CORMORANT_PERSISTED_MAX_MESSAGES``) as an operator
sees it: a persistent DEVICE client that stays away while more than the cap is published
to it loses the oldest messages, and that shows on device_persist's ``/metrics``
(``cormorant_device_store_dropped_messages_total``), in the Grafana panel's query over a
real Prometheus, in its WARNING lines, in the admin API's session view and in the console's
session details. The client gets the newest messages when it is back.

device_persist runs with a cap of :data:`CAP` in place of the cluster's for the test (same
static consumer group member, same HTTP port: Prometheus and the admin service find it
where they find the cluster's), which is started again at the end: ``disruptive``.
"""

from __future__ import annotations

import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from services.common.metrics import parse_exposition, total
from services.local import cluster as local_cluster
from services.local.settings import LocalSettings
from tests.browser import chromium
from tests.e2e.admin import AdminApi, admin_api, open_console
from tests.e2e.clients import PahoClient, unique
from tests.e2e.prometheus import panel_expr, query, running_prometheus, value
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.disruptive]

#: The per-client cap of the test's device_persist (messages).
CAP = 5

#: QoS 1 messages published to the away client: CAP are kept, the rest dropped.
PUBLISHED = 12

#: Seconds a change may take to travel through Kafka to device_persist, the store, the
#: admin service or Prometheus (a busy, shared machine can take several).
SECONDS = 60.0

#: The metric, and the Grafana panel that shows its rate.
METRIC = "cormorant_device_store_dropped_messages_total"
PANEL = "DEVICE store: dropped by the cap / s"

#: The console's session detail that shows the client's count.
FACT = "Dropped by the store's cap"

#: The name of the test's device_persist process.
CAPPED = "device-persist-capped"


@contextmanager
def capped_device_persist(cluster: LocalCluster, cap: int) -> Iterator[str]:
    """device_persist with a per-client cap of ``cap`` messages in place of the cluster's
    (which is stopped, and started again when the block ends): the same static consumer
    group member (it takes over the partitions at once) and HTTP port. Yields the URL of
    its ``/metrics``."""
    name = local_cluster.DEVICE_PERSIST
    port = local_cluster.http_ports(cluster.settings)[name]
    cluster.stop(name)
    try:
        cluster.start_extra(
            CAPPED,
            name,
            http_port=str(port),
            group_instance_id=name,
            persisted_max_messages=str(cap),
        )
        try:
            yield f"http://127.0.0.1:{port}/metrics"
        finally:
            cluster.stop_extra(CAPPED)
    finally:
        cluster.start(name)


def scraped(url: str, name: str) -> float:
    """The value of sample ``name`` (summed over its series) at the ``/metrics`` ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return total(parse_exposition(response.read().decode()), name)


def session_detail(api: AdminApi, client_id: str) -> dict[str, Any] | None:
    """``GET /api/sessions/{client_id}``'s body; None while the admin service knows no such
    session (404)."""
    response = api.call("GET", f"/api/sessions/{urllib.parse.quote(client_id, safe='')}")
    if response.status_code == 404:
        return None
    assert response.status_code == 200, (response.status_code, response.text)
    detail: dict[str, Any] = response.json()
    return detail


def test_messages_dropped_by_the_cap_are_counted_shown_and_the_newest_kept(
    cluster: LocalCluster, settings: LocalSettings, tmp_path: Path
) -> None:
    api = admin_api(settings)
    client_id = unique("capped-sub")
    topic = unique("capped/topic")
    dropped = PUBLISHED - CAP
    with (
        capped_device_persist(cluster, CAP) as metrics_url,
        running_prometheus(settings, tmp_path) as prometheus,
    ):
        rate = panel_expr(PANEL)
        # Prometheus has seen the counter at 0 (two scrapes make a rate) before any drop.
        wait_until(lambda: query(prometheus, rate), f"the {PANEL!r} query answering", SECONDS)
        assert value(prometheus, rate) == 0
        assert scraped(metrics_url, METRIC) == 0
        subscriber = PahoClient(cluster.mqtt_port, client_id, session_expiry=600)
        try:
            assert subscriber.connect() == 0
            subscriber.subscribe(topic, 1)
        finally:
            subscriber.close()
        wait_until(
            lambda: (d := session_detail(api, client_id)) is not None and not d["connected"],
            "the session shown disconnected",
            SECONDS,
        )
        publisher = PahoClient(cluster.mqtt_port, unique("capped-pub"))
        assert publisher.connect() == 0
        try:
            mids = [publisher.publish(topic, b"%d" % i, 1) for i in range(PUBLISHED)]
            wait_until(lambda: set(mids) <= set(publisher.snapshot()[0]), "the PUBACKs")
            # Every message was accepted: what the cap drops, its publisher thinks delivered.
            assert all(code.value == 0 for code in publisher.snapshot()[0].values())

            wait_until(
                lambda: scraped(metrics_url, METRIC) >= dropped, f"{METRIC} at {dropped}", SECONDS
            )
            assert scraped(metrics_url, METRIC) == dropped
            wait_until(lambda: value(prometheus, rate) > 0, f"the {PANEL!r} query above 0", SECONDS)
            detail = session_detail(api, client_id)
            assert detail is not None
            assert (detail["stored_messages"], detail["dropped_messages"]) == (CAP, dropped)
            # A WARNING per batch that dropped some, never one per message: the drops may
            # come in several batches, and their lines add up to the count.
            lines = re.findall(
                rf"client {re.escape(repr(client_id))}: store full \({CAP} messages\), "
                r"dropped its (\d+) oldest",
                cluster.log(CAPPED).read_text(encoding="utf-8", errors="replace"),
            )
            assert sum(int(n) for n in lines) == dropped, lines

            with chromium() as browser, open_console(browser, api) as page:
                page.goto(f"{api.url}/#/session/{urllib.parse.quote(client_id, safe='')}")
                expect(page.locator("#session-title")).to_have_text(client_id)
                shown = page.locator(f'#session-facts dt:text-is("{FACT}") + dd')
                expect(shown).to_have_text(str(dropped))
                expect(shown).to_have_class(re.compile(r"\bbad\b"))

            # Back, the client gets the newest CAP messages, in order, then what follows.
            back = PahoClient(cluster.mqtt_port, client_id, clean_start=False, session_expiry=600)
            try:
                assert back.connect() == 0
                wait_until(lambda: back.messages.qsize() >= CAP, f"{CAP} stored messages")
                publisher.publish(topic, b"marker", 1)
                wait_until(lambda: back.messages.qsize() >= CAP + 1, "the marker")
                payloads = [back.messages.get_nowait().payload for _ in range(CAP + 1)]
                assert payloads == [b"%d" % i for i in range(dropped, PUBLISHED)] + [b"marker"]
            finally:
                back.close()
        finally:
            publisher.close()
            # End the session (Clean Start, no Session Expiry Interval: gone at DISCONNECT).
            ending = PahoClient(cluster.mqtt_port, client_id)
            assert ending.connect() == 0
            ending.close()
