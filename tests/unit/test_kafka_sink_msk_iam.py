"""The Kafka sink's Amazon MSK IAM login (docs/integrations/kafka.md, "Amazon MSK with IAM"):
what is refused, the producer's options, the tokens signed for the sink's Region with the
stage's credentials or an assumed role (moto's STS), and no credential shown or logged."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from urllib.parse import parse_qs, urlsplit

import click
import pytest
from moto import mock_aws
from moto.sts.models import sts_backends

from services.admin.integrations_api import KafkaSinkBody, view
from services.common.integrations.model import (
    Integration,
    IntegrationError,
    IntegrationKind,
    KafkaSink,
    SinkSecrets,
    check_integration,
    public_view,
    sink_from_json,
)
from services.common.kafka.security import MskIamTokenProvider
from services.common.settings import Settings
from services.integrations.kafka_sink import KafkaSinkWriter, sink_security
from services.integrations_cli import _sink_body

ROLE = "arn:aws:iam::210987654321:role/team/cormorant-export"
STATIC_KEY, STATIC_SECRET = "AKIASTATICEXAMPLE", "static-secret-access-key-example"


def msk(**changes: object) -> Integration:
    sink: dict[str, object] = {
        "bootstrap": "b-1.plant.kafka.eu-west-1.amazonaws.com:9098",
        "topic": "mqtt.plant",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "AWS_MSK_IAM",
        "aws_region": "eu-west-1",
    }
    secrets = changes.pop("secrets", SinkSecrets())
    sink.update(changes)
    return Integration(
        uuid.uuid4(),
        "plant-export",
        IntegrationKind.KAFKA,
        ("plant/#",),
        KafkaSink(**sink),  # type: ignore[arg-type]
        secrets=secrets,  # type: ignore[arg-type]
    )


def signed_query(token: str) -> tuple[str, dict[str, list[str]]]:
    """The host and query of the presigned request an MSK IAM token is."""
    url = urlsplit(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    return url.netloc, parse_qs(url.query)


@pytest.fixture
def static_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage's AWS credentials, as the default chain finds them (ECS: the task role)."""
    for name, value in {
        "AWS_ACCESS_KEY_ID": STATIC_KEY,
        "AWS_SECRET_ACCESS_KEY": STATIC_SECRET,
        "AWS_DEFAULT_REGION": "eu-west-1",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"security_protocol": "SASL_PLAINTEXT"}, "needs security protocol SASL_SSL"),
        ({"aws_region": None}, "needs the cluster's AWS Region"),
        ({"aws_region": "eu west 1"}, "is not an AWS Region"),
        ({"aws_region": "eu-west-1\n"}, "is not an AWS Region"),
        ({"aws_role_arn": "arn:aws:iam::2109:role/x"}, "is not an IAM role ARN"),
        ({"aws_role_arn": "arn:aws:iam::210987654321:user/x"}, "is not an IAM role ARN"),
        ({"sasl_username": "exporter"}, "takes no user name or password"),
        ({"secrets": SinkSecrets("pw")}, "takes no user name or password"),
        ({"sasl_mechanism": "OAUTHBEARER"}, "one of SCRAM-SHA-256, .*AWS_MSK_IAM"),
        (
            {"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "u", "secrets": SinkSecrets("p")},
            "AWS Region or role ARN is for SASL mechanism AWS_MSK_IAM",
        ),
        (
            {"security_protocol": "SSL", "sasl_mechanism": None, "aws_region": None,
             "aws_role_arn": ROLE},
            "AWS Region or role ARN is for",
        ),
    ],
)  # fmt: skip
def test_msk_iam_check_refuses_what_cannot_run(changes: dict[str, object], message: str) -> None:
    with pytest.raises(IntegrationError, match=message):
        check_integration(msk(**changes))


def test_msk_iam_sink_is_stored_and_shown_with_its_region_and_role() -> None:
    integration = check_integration(msk(aws_role_arn=ROLE))
    stored = json.loads(json.dumps(integration.sink.to_json()))
    assert sink_from_json(IntegrationKind.KAFKA, stored) == integration.sink
    shown = public_view(integration)["sink"]
    assert (shown["sasl_mechanism"], shown["aws_region"], shown["aws_role_arn"]) == (
        "AWS_MSK_IAM",
        "eu-west-1",
        ROLE,
    )
    assert view(integration).sink.model_dump()["aws_role_arn"] == ROLE
    body = KafkaSinkBody.model_validate(
        {"bootstrap": "b:9098", "topic": "t", "security_protocol": "SASL_SSL",
         "sasl_mechanism": "AWS_MSK_IAM", "aws_region": "eu-west-1"}
    )  # fmt: skip
    assert body.aws_region == "eu-west-1"
    # Sinks stored before MSK IAM existed read as they were.
    del stored["aws_region"], stored["aws_role_arn"]
    assert sink_from_json(IntegrationKind.KAFKA, stored).aws_region is None  # type: ignore[union-attr]


def test_the_cli_takes_the_msk_iam_options_for_kafka_only() -> None:
    options = {"sasl_mechanism": "AWS_MSK_IAM", "aws_region": "eu-west-1", "aws_role_arn": ROLE}
    assert _sink_body(options, "kafka") == options
    with pytest.raises(click.UsageError, match="--aws-region is not an option of a webhook"):
        _sink_body({"aws_region": "eu-west-1"}, "webhook")


async def test_the_producer_logs_in_with_oauthbearer_over_tls() -> None:
    integration = check_integration(msk(aws_role_arn=ROLE))
    options = sink_security(integration)
    provider = options["sasl_oauth_token_provider"]
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "OAUTHBEARER"
    assert "sasl_plain_password" not in options and options["ssl_context"] is not None
    assert isinstance(provider, MskIamTokenProvider)
    assert (provider.region, provider.role_arn, provider.session_name) == (
        "eu-west-1",
        ROLE,
        "cormorant-plant-export",
    )
    writer = KafkaSinkWriter(Settings(), integration, "cormorant-integrations.x")
    producer = writer._producer("cormorant-integrations.x.msg.all-0")
    client = producer.client
    assert (client._security_protocol, client._sasl_mechanism) == ("SASL_SSL", "OAUTHBEARER")
    # One provider per writer: its producers and admin client share the token.
    shared = writer.security["sasl_oauth_token_provider"]
    assert repr(shared) == repr(provider)
    assert client._sasl_oauth_token_provider is shared
    assert writer._admin._client._sasl_oauth_token_provider is shared
    await producer.stop()
    await writer.close()


async def test_the_token_is_signed_for_the_sinks_region_with_the_stages_credentials(
    static_credentials: None,
) -> None:
    provider = sink_security(check_integration(msk(aws_region="ap-southeast-2")))[
        "sasl_oauth_token_provider"
    ]
    host, query = signed_query(await provider.token())
    assert host == "kafka.ap-southeast-2.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith(f"{STATIC_KEY}/")
    assert query["X-Amz-Credential"][0].endswith("/ap-southeast-2/kafka-cluster/aws4_request")
    assert "X-Amz-Security-Token" not in query


async def test_with_a_role_the_token_is_signed_with_the_assumed_roles_credentials(
    static_credentials: None,
) -> None:
    with mock_aws():
        provider = sink_security(check_integration(msk(aws_role_arn=ROLE)))[
            "sasl_oauth_token_provider"
        ]
        host, query = signed_query(await provider.token())
        (assumed,) = sts_backends["210987654321"]["aws"].assumed_roles
    assert (assumed.role_arn, assumed.session_name) == (ROLE, "cormorant-plant-export")
    assert host == "kafka.eu-west-1.amazonaws.com"
    assert query["X-Amz-Credential"][0].startswith(f"{assumed.access_key_id}/")
    assert query["X-Amz-Security-Token"] == [assumed.session_token]


async def test_no_credential_or_token_is_shown_or_logged(
    static_credentials: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # the services' most talkative log level
    integration = check_integration(msk())
    provider = sink_security(integration)["sasl_oauth_token_provider"]
    token = await provider.token()
    _, query = signed_query(token)
    (signature,) = query["X-Amz-Signature"]
    assert signature not in caplog.text and token not in caplog.text
    assert STATIC_SECRET not in caplog.text
    for shown in (repr(provider), json.dumps(public_view(integration)), repr(integration)):
        assert token not in shown and signature not in shown and STATIC_SECRET not in shown
