"""The Kafka source options of the Spark jobs, for each way a cluster authenticates clients.

One pure function, used by the local runs and by the EMR submission alike. The options are
Spark's Kafka source options (``kafka.``-prefixed consumer configs, Spark Structured
Streaming + Kafka Integration Guide); SCRAM follows MSK's SASL/SCRAM setup (port 9096), IAM
MSK's IAM access control with ``aws-msk-iam-auth`` (port 9098, its jar on the classpath).
"""

from __future__ import annotations

from typing import Literal

KafkaAuth = Literal["none", "scram", "iam"]

SCRAM_MECHANISM = "SCRAM-SHA-512"


def _jaas_quote(text: str) -> str:
    """``text`` as a JAAS option value: double-quoted, ``\\`` and ``"`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kafka_options(
    bootstrap: str,
    auth: KafkaAuth = "none",
    *,
    tls: bool = False,
    username: str | None = None,
    password: str | None = None,
) -> dict[str, str]:
    """Spark Kafka source options that reach ``bootstrap`` (``host:port[,…]``) with ``auth``.

    - ``none``: ``PLAINTEXT``, or ``SSL`` when ``tls``;
    - ``scram``: ``SASL_SSL`` with SCRAM-SHA-512 and ``username`` / ``password``;
    - ``iam``: ``SASL_SSL`` with ``AWS_MSK_IAM``: the job's IAM role signs in (no secret).

    Returns a new dict of option name → value (the password sits in
    ``kafka.sasl.jaas.config``: never log it). Raises ``ValueError`` for an unknown ``auth``,
    SCRAM without both credentials, or an empty ``bootstrap``.
    """
    if not bootstrap.strip():
        raise ValueError("the Kafka bootstrap address is empty")
    options = {"kafka.bootstrap.servers": bootstrap}
    if auth == "none":
        options["kafka.security.protocol"] = "SSL" if tls else "PLAINTEXT"
    elif auth == "scram":
        if not username or not password:
            raise ValueError("SCRAM authentication needs a user name and a password")
        options |= {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": SCRAM_MECHANISM,
            "kafka.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f"username={_jaas_quote(username)} password={_jaas_quote(password)};"
            ),
        }
    elif auth == "iam":
        options |= {
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "AWS_MSK_IAM",
            "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
            "kafka.sasl.client.callback.handler.class": (
                "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
            ),
        }
    else:
        raise ValueError(f"unknown Kafka authentication {auth!r}: none, scram or iam")
    return options


def redacted(options: dict[str, str]) -> dict[str, str]:
    """``options`` with the JAAS configuration (it may hold a password) replaced by ``***``."""
    return {k: ("***" if k == "kafka.sasl.jaas.config" else v) for k, v in options.items()}
