"""The Spark jobs' Kafka options for none, SCRAM and IAM authentication (one pure function)."""

from __future__ import annotations

import pytest

from spark_emr.kafka_options import kafka_options, redacted


def test_no_authentication_is_plaintext_or_tls() -> None:
    assert kafka_options("k:9092") == {
        "kafka.bootstrap.servers": "k:9092",
        "kafka.security.protocol": "PLAINTEXT",
    }
    assert kafka_options("k:9094", tls=True)["kafka.security.protocol"] == "SSL"


def test_scram_is_sasl_ssl_sha512_with_quoted_credentials() -> None:
    options = kafka_options("b-1:9096", "scram", username="ana", password='p"w\\d')
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert options["kafka.sasl.jaas.config"] == (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="ana" password="p\\"w\\\\d";'
    )
    assert redacted(options)["kafka.sasl.jaas.config"] == "***"
    assert 'p\\"w' not in str(redacted(options))


def test_iam_uses_the_msk_login_module_and_callback_handler() -> None:
    options = kafka_options("b-1:9098", "iam")
    assert options == {
        "kafka.bootstrap.servers": "b-1:9098",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.sasl.mechanism": "AWS_MSK_IAM",
        "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "kafka.sasl.client.callback.handler.class": (
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
        ),
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bootstrap": " ", "auth": "none"}, "empty"),
        ({"bootstrap": "k:1", "auth": "scram", "username": "u"}, "password"),
        ({"bootstrap": "k:1", "auth": "kerberos"}, "unknown Kafka authentication"),
    ],
)
def test_bad_options_are_refused_clearly(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kafka_options(**kwargs)  # type: ignore[arg-type]
