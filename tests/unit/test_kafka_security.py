"""Settings → the Kafka clients' security options (services/common/kafka/security.py), and
secrets that never print. The servers' side is tests/integration/test_secured_cluster.py."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from click.testing import CliRunner
from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials
from faust.types.auth import AuthProtocol
from pydantic import SecretStr

from services.cli import main
from services.common.faust_app import make_app
from services.common.kafka.consumer import make_consumer
from services.common.kafka.security import (
    KafkaSecurityError,
    MskIamTokenProvider,
    client_security,
    faust_credentials,
)
from services.common.settings import Settings
from services.local.cluster import child_environment
from tests.pki import make_pki


@pytest.fixture(scope="module")
def cafile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki")).ca


def scram(**values: Any) -> Settings:
    defaults: dict[str, Any] = {
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_mechanism": "SCRAM-SHA-512",
        "kafka_sasl_username": "cormorant",
        "kafka_sasl_password": SecretStr("s3cret-scram"),
    }
    return Settings(**{**defaults, **values})


def test_plaintext_is_the_local_default() -> None:
    assert client_security(Settings()) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(Settings()) is None


def test_tls_verifies_the_brokers_certificate_and_name(cafile: Path) -> None:
    options = client_security(Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=cafile))
    context: ssl.SSLContext = options["ssl_context"]
    assert options["security_protocol"] == "SSL"
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("organizationName", "Cormorant local cluster"),), (("commonName", "Cormorant test CA"),))
    ]
    credentials = faust_credentials(
        Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=cafile)
    )
    assert isinstance(credentials, SSLCredentials)


def test_without_a_ca_file_the_system_trust_store_is_used() -> None:
    context = client_security(Settings(kafka_security_protocol="SSL"))["ssl_context"]
    assert context.cert_store_stats()["x509_ca"] > 0  # MSK's certificates chain to these


def test_scram_sha_512(cafile: Path) -> None:
    settings = scram(kafka_ssl_cafile=cafile)
    options = client_security(settings)
    assert {k: v for k, v in options.items() if k != "ssl_context"} == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "cormorant",
        "sasl_plain_password": "s3cret-scram",
    }
    credentials = faust_credentials(settings)
    assert isinstance(credentials, SASLCredentials)
    assert credentials.protocol is AuthProtocol.SASL_SSL
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    assert (credentials.username, credentials.password) == ("cormorant", "s3cret-scram")


def test_scram_without_a_password_is_refused() -> None:
    with pytest.raises(KafkaSecurityError, match="CORMORANT_KAFKA_SASL_PASSWORD"):
        client_security(scram(kafka_sasl_password=None))


def test_msk_iam(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    iam = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="OAUTHBEARER")
    with pytest.raises(KafkaSecurityError, match="needs a region"):
        client_security(iam)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")  # ECS sets it in every task
    options = client_security(iam)
    assert options["sasl_mechanism"] == "OAUTHBEARER"
    assert options["sasl_oauth_token_provider"].region == "eu-west-1"
    credentials = faust_credentials(iam)
    assert isinstance(credentials, OAuthCredentials)
    assert credentials.protocol is AuthProtocol.SASL_SSL


async def test_msk_iam_token_is_a_signed_connect_request_reused_until_near_expiry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY",
        "AWS_SECRET_ACCESS_KEY": "example-secret",
        "AWS_SESSION_TOKEN": "example-session",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    signed: list[str] = []
    real = MSKAuthTokenProvider.generate_auth_token

    def counting(region: str) -> tuple[str, int]:
        signed.append(region)
        result: tuple[str, int] = real(region)
        return result

    monkeypatch.setattr(MSKAuthTokenProvider, "generate_auth_token", counting)
    provider = MskIamTokenProvider("eu-west-1")
    token = await provider.token()
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    assert parts.netloc == "kafka.eu-west-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith("AKIAEXAMPLEKEY/")
    assert query["X-Amz-Credential"][0].endswith("/eu-west-1/kafka-cluster/aws4_request")
    assert query["X-Amz-Expires"] == ["900"]
    assert await provider.token() == token
    assert signed == ["eu-west-1"]


async def test_every_kafka_client_gets_the_security(cafile: Path, tmp_path: Path) -> None:
    settings = scram(kafka_ssl_cafile=cafile, state_dir=tmp_path)
    consumer = make_consumer(settings, "t", group_id=None)
    assert consumer._client._security_protocol == "SASL_SSL"
    assert consumer._client._sasl_mechanism == "SCRAM-SHA-512"
    app = make_app(settings, "router")
    assert isinstance(app.conf.broker_credentials, SASLCredentials)


def test_secrets_never_print(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = scram(redis_password=SecretStr("s3cret-redis"), postgres_password="s3cret-pg")
    text = repr(settings) + str(settings.model_dump(mode="json"))
    assert not any(word in text for word in ("s3cret-scram", "s3cret-redis", "s3cret-pg"))
    monkeypatch.setenv("CORMORANT_SETTINGS_FILE", str(tmp_path / "none.env"))
    monkeypatch.setenv("CORMORANT_KAFKA_SASL_PASSWORD", "s3cret-scram")
    listed = CliRunner().invoke(main, ["settings"]).output
    assert "CORMORANT_KAFKA_SASL_PASSWORD=**********" in listed
    assert "s3cret-scram" not in listed


def test_the_local_launcher_hands_services_the_real_secrets() -> None:
    env = child_environment(scram(redis_password=SecretStr("s3cret-redis")))
    assert env["CORMORANT_KAFKA_SASL_PASSWORD"] == "s3cret-scram"
    assert env["CORMORANT_REDIS_PASSWORD"] == "s3cret-redis"
