"""The Spark jobs' Kafka options for every security protocol and SASL mechanism of
Cormorant's settings (one pure function)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import SecretStr

from services.common.settings import KafkaSaslMechanism, KafkaSecurityProtocol, Settings
from spark_emr.kafka_options import kafka_options, kafka_options_of, redacted


def test_plaintext_and_tls() -> None:
    assert kafka_options("k:9092") == {
        "kafka.bootstrap.servers": "k:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }
    assert kafka_options("k:9094", "SSL")["kafka.security.protocol"] == "SSL"
    # A CA file (PEM) is the truststore; none: the JVM's (MSK chains to public roots).
    assert kafka_options("k:9094", "SSL", cafile=Path("/ca.pem")) == {
        "kafka.bootstrap.servers": "k:9094",
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/ca.pem",
    }
    assert "kafka.ssl.truststore.location" not in kafka_options("k:9092", cafile=Path("/ca.pem"))


def test_scram_is_sasl_ssl_sha512_with_quoted_credentials() -> None:
    options = kafka_options(
        "b-1:9096", "SASL_SSL", "SCRAM-SHA-512", username="ana", password='p"w\\d'
    )
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="ana" password="p\\"w\\\\d";'
    )
    assert redacted(options)["kafka.sasl.jaas.config"] == "***"
    assert 'p\\"w' not in str(redacted(options))


def test_msk_iam_uses_the_msk_login_module_and_callback_handler() -> None:
    options = kafka_options("b-1:9098", "SASL_SSL", "OAUTHBEARER")
    assert options == {
        "kafka.bootstrap.servers": "b-1:9098",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "AWS_MSK_IAM",
        "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "kafka.sasl.client.callback.handler.class": (
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
        ),
    }


@pytest.mark.parametrize("protocol", typing.get_args(KafkaSecurityProtocol))
@pytest.mark.parametrize("mechanism", typing.get_args(KafkaSaslMechanism))
def test_every_setting_value_has_spark_options(protocol: str, mechanism: str) -> None:
    options = kafka_options("k:1", protocol, mechanism, username="u", password="p")  # type: ignore[arg-type]
    assert options["kafka.security.protocol"] == protocol


def test_the_settings_give_the_options() -> None:
    assert kafka_options_of(Settings.model_construct(kafka_bootstrap="k:9092")) == kafka_options(
        "k:9092"
    )
    scram = Settings.model_construct(
        kafka_bootstrap="b-1:9096",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="cormorant",
        kafka_sasl_password=SecretStr("pw"),
        kafka_ssl_cafile=Path("/ca.pem"),
    )
    assert kafka_options_of(scram, "other:9096") == kafka_options(
        "other:9096",
        "SASL_SSL",
        "SCRAM-SHA-512",
        username="cormorant",
        password="pw",
        cafile=Path("/ca.pem"),
    )
    iam = Settings.model_construct(
        kafka_bootstrap="b-1:9098",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="OAUTHBEARER",
    )
    assert kafka_options_of(iam)["kafka.sasl.mechanism"] == "AWS_MSK_IAM"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap": " "}, "empty"),
        ({"bootstrap": "k:1", "protocol": "SASL_SSL", "username": "u"}, "password"),
        ({"bootstrap": "k:1", "protocol": "SASL_PLAINTEXT"}, "unknown Kafka security protocol"),
        ({"bootstrap": "k:1", "protocol": "SASL_SSL", "mechanism": "GSSAPI"}, "unknown SASL"),
    ],
)
def test_bad_options_are_refused_clearly(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kafka_options(**kwargs)  # type: ignore[arg-type]
