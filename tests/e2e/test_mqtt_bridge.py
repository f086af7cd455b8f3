"""The MQTT bridge end to end (issue 27 part 4): an integration of kind ``mqtt`` added with
``cormorant integrations add --kind mqtt``, run by the test cluster's integrations stage,
forwarding what a third-party client (paho) publishes here to a real Mosquitto the tests
start, on the mapped topics, in order and with none lost across a restart of Mosquitto in
the middle of the stream; and the reverse direction: what is published on Mosquitto
arrives here, mapped back, published with the bridge's credential."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from services.common.metrics import parse_exposition
from services.local import cluster as local_cluster
from services.local import postgres
from services.local.processes import port_open
from services.local.settings import LocalSettings
from tests.commands import run_cormorant
from tests.e2e.admin import PASSWORD, admin_api, running
from tests.e2e.clients import PahoClient, mosquitto_pub, unique
from tests.e2e.test_integrations import SINK_SECONDS, STAGE, Cli
from tests.servers import LocalCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.cluster

#: Seconds Mosquitto may take to listen, and to exit after SIGTERM.
MOSQUITTO_SECONDS = 10.0

#: Session Expiry Interval of the test's subscriber on Mosquitto: its messages wait there
#: while it is away (the restart).
SESSION_SECONDS = 600

CONF = """\
listener {port} 127.0.0.1
allow_anonymous true
persistence true
persistence_location {directory}/
log_dest file {directory}/mosquitto.log
"""


class Mosquitto:
    """A Mosquitto on a free loopback port, keeping its sessions and queued messages in
    ``directory`` across a restart (persistence, written when it stops)."""

    def __init__(self, directory: Path) -> None:
        self.port = local_cluster.free_port()
        self.directory = directory
        self.conf = directory / "mosquitto.conf"
        self.conf.write_text(CONF.format(port=self.port, directory=directory), encoding="utf-8")
        if os.geteuid() == 0:
            # Started as root, Mosquitto becomes user mosquitto before writing its files.
            user = pwd.getpwnam("mosquitto")
            for path in (directory, self.conf):
                os.chown(path, user.pw_uid, user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it and wait until it listens."""
        binary = "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else "mosquitto"
        self.process = subprocess.Popen([binary, "-c", str(self.conf)])
        wait_until(lambda: port_open(self.port), "Mosquitto listening", MOSQUITTO_SECONDS)

    def stop(self) -> None:
        """SIGTERM (it saves its sessions) and wait for it to exit."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(MOSQUITTO_SECONDS)
            self.process = None

    def subscriber(self, client_id: str) -> PahoClient:
        """A connected MQTT 5 client of this Mosquitto whose session outlives it."""
        client = PahoClient(self.port, client_id, clean_start=False, session_expiry=SESSION_SECONDS)
        assert client.connect() == 0
        return client


@pytest.fixture(scope="module")
def cli(settings: LocalSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cli]:
    """The CLI logged in as an admin user of the running test cluster."""
    api = admin_api(running(settings))
    cli = Cli(tmp_path_factory.mktemp("config"))
    cli("login", api.url, "--username", api.username, "--password-file", "-", input=PASSWORD)
    yield cli
    cli("logout")


@pytest.fixture(scope="module")
def mosquitto() -> Iterator[Mosquitto]:
    """The remote broker of the bridge tests, its files in a directory of its own under
    the system's temporary directory (pytest's are closed to Mosquitto's user)."""
    directory = Path(tempfile.mkdtemp(prefix="bridge-mosquitto-"))
    broker = Mosquitto(directory)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        shutil.rmtree(directory, ignore_errors=True)


def drain(client: PahoClient, into: list[paho.MQTTMessage]) -> list[paho.MQTTMessage]:
    """``into`` with what ``client`` received meanwhile appended."""
    while not client.messages.empty():
        into.append(client.messages.get())
    return into


def distinct(messages: list[paho.MQTTMessage]) -> list[int]:
    """The sequence numbers of ``messages`` (their payloads) as each first came."""
    firsts: list[int] = []
    for message in messages:
        seq = int(message.payload)
        if seq not in firsts:
            firsts.append(seq)
    return firsts


def stage_metric(cluster: LocalCluster, name: str, integration: str) -> float:
    """The integrations stage's ``name`` sample of ``integration`` (0 when absent)."""
    port = local_cluster.http_ports(cluster.settings)[STAGE]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        samples = parse_exposition(response.read().decode())
    return sum(v for labels, v in samples.get(name, ()) if labels["integration"] == integration)


def test_bridge_forwards_mapped_and_in_order_with_none_lost_across_a_remote_restart(
    cluster: LocalCluster, cli: Cli, mosquitto: Mosquitto
) -> None:
    name, local = unique("bridge"), unique("sensors")
    remote = f"site1/{local}"
    received: list[paho.MQTTMessage] = []
    subscriber_id = unique("remote-sub")
    subscriber = mosquitto.subscriber(subscriber_id)
    assert subscriber.subscribe(f"{remote}/#", 1)[0].value == 1
    added = cli.json(
        "integrations", "add", name, "--kind", "mqtt", "--topic-filter", f"{local}/#",
        "--format", "raw", "--mqtt-host", "127.0.0.1", "--mqtt-port", str(mosquitto.port),
        "--local-prefix", local, "--remote-prefix", remote, "--qos", "1",
    )  # fmt: skip
    assert added["sink"]["remote_prefix"] == remote
    publisher = PahoClient(cluster.mqtt_port, unique("sensor"))
    assert publisher.connect() == 0

    def publish(first: int, last: int) -> None:
        for seq in range(first, last + 1):
            publisher.publish(f"{local}/line-1/temp", str(seq).encode(), 1)

    def arrived(count: int) -> bool:
        return len(distinct(drain(subscriber, received))) >= count

    try:
        publish(1, 10)
        wait_until(lambda: arrived(10), "10 messages on Mosquitto", SINK_SECONDS)
        mosquitto.stop()
        publish(11, 20)
        # The bridge met the outage: its round of 11..20 failed (and is retried).
        wait_until(
            lambda: stage_metric(cluster, "cormorant_integration_messages_failed_total", name),
            "the bridge failing while Mosquitto is down",
            SINK_SECONDS,
        )
        mosquitto.start()
        drain(subscriber, received)
        subscriber.close()
        subscriber = mosquitto.subscriber(subscriber_id)  # the session resumed
        publish(21, 30)
        wait_until(lambda: arrived(30), "30 messages on Mosquitto", SINK_SECONDS)
        # Read while the integration runs: the stage drops its counters once it is deleted.
        retried = stage_metric(cluster, "cormorant_integration_messages_retried_total", name)
    finally:
        publisher.close()
        subscriber.close()
        if mosquitto.process is None:
            mosquitto.start()
        cli("integrations", "delete", name)

    assert distinct(received) == list(range(1, 31))  # none lost, first copies in order
    assert {m.topic for m in received} == {f"{remote}/line-1/temp"}
    assert retried > 0


def test_reverse_direction_publishes_remote_messages_here_mapped_back_with_its_credential(
    cluster: LocalCluster, cli: Cli, mosquitto: Mosquitto
) -> None:
    name, local = unique("reverse"), unique("plant")
    remote = f"site2/{local}"
    user, password = unique("bridge-in"), unique("pw")
    env = {**os.environ, "CORMORANT_POSTGRES_DSN": postgres.dsn(cluster.settings)}
    credential = run_cormorant(
        "credentials", "add", user, "--username", user, "--password-file", "-",
        "--rule", f"allow publish {local}/cmd/#", env=env, input=password,
    )  # fmt: skip
    assert credential.returncode == 0, credential.stderr
    # A forward filter whose remote topics a reverse filter would match is a loop: refused.
    looping = cli(
        "integrations", "add", unique("loop"), "--kind", "mqtt", "--topic-filter",
        f"{local}/#", "--mqtt-host", "127.0.0.1", "--mqtt-port", str(mosquitto.port),
        "--local-prefix", local, "--remote-prefix", remote,
        "--reverse-topic-filter", f"{remote}/cmd/#", "--local-username", user,
        "--local-password-file", "-", input=password, code=1,
    )  # fmt: skip
    assert "loop" in looping.output
    listener = PahoClient(cluster.mqtt_port, unique("listener"))
    assert listener.connect() == 0
    assert listener.subscribe(f"{local}/cmd/#", 1)[0].value == 1
    # Retained on Mosquitto before the bridge subscribes: it arrives whenever that is.
    first = mosquitto_pub(mosquitto.port, f"{remote}/cmd/valve", "1", qos=1, extra=("-r",))
    assert first.returncode == 0, first.stderr
    cli(
        "integrations", "add", name, "--kind", "mqtt", "--topic-filter", f"{local}/out/#",
        "--mqtt-host", "127.0.0.1", "--mqtt-port", str(mosquitto.port),
        "--local-prefix", local, "--remote-prefix", remote,
        "--reverse-topic-filter", f"{remote}/cmd/#", "--local-username", user,
        "--local-password-file", "-", input=password,
    )  # fmt: skip
    received: list[paho.MQTTMessage] = []
    try:
        wait_until(lambda: drain(listener, received), "the retained command here", SINK_SECONDS)
        for seq in (2, 3):
            sent = mosquitto_pub(mosquitto.port, f"{remote}/cmd/valve", str(seq), qos=1)
            assert sent.returncode == 0, sent.stderr
        wait_until(lambda: len(drain(listener, received)) >= 3, "3 commands", SINK_SECONDS)
    finally:
        listener.close()
        cli("integrations", "delete", name)
        assert run_cormorant("credentials", "delete", user, env=env).returncode == 0

    assert [(m.topic, int(m.payload)) for m in received] == [
        (f"{local}/cmd/valve", 1), (f"{local}/cmd/valve", 2), (f"{local}/cmd/valve", 3),
    ]  # fmt: skip
