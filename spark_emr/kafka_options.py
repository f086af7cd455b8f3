"""The Kafka source options of the Spark jobs: Cormorant's Kafka security settings, written
the way Spark's Java Kafka client reads them.

The jobs reach Kafka as every other Kafka client of Cormorant does, from the same settings
(``kafka_security_protocol``, ``kafka_sasl_mechanism``, ``kafka_sasl_username``,
``kafka_sasl_password``, ``kafka_ssl_cafile``: :mod:`services.common.settings`, which
:mod:`services.common.kafka.security` turns into the services' aiokafka options). One pure
function, :func:`kafka_options`, writes them as Spark's Kafka source options
(``kafka.``-prefixed consumer configs, Spark Structured Streaming + Kafka Integration
Guide), for the local runs and the EMR submission alike; :func:`kafka_options_of` applies
it to a settings object. SCRAM-SHA-512 follows MSK's SASL/SCRAM setup (port 9096);
OAUTHBEARER, which the services sign with aws-msk-iam-sasl-signer, is MSK's IAM access
control for the Java client: ``AWS_MSK_IAM`` of ``aws-msk-iam-auth`` (port 9098, its jar on
the classpath), signed with the job's IAM role.

Nothing but the standard library at run time: the EMR driver imports this module
(:mod:`spark_emr.secrets`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.settings import KafkaSaslMechanism, KafkaSecurityProtocol, Settings

#: The JAAS option that may carry a password.
JAAS_CONFIG = "kafka.sasl.jaas.config"


def _jaas_quote(text: str) -> str:
    """``text`` as a JAAS option value: double-quoted, ``\\`` and ``"`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def kafka_options(
    bootstrap: str,
    protocol: KafkaSecurityProtocol = "PLAINTEXT",
    mechanism: KafkaSaslMechanism = "SCRAM-SHA-512",
    *,
    username: str | None = None,
    password: str | None = None,
    cafile: Path | None = None,
) -> dict[str, str]:
    """Spark Kafka source options that reach ``bootstrap`` (``host:port[,…]``) speaking
    ``protocol`` (Kafka's ``security.protocol``), with the SASL ``mechanism`` of
    ``SASL_SSL``:

    - ``PLAINTEXT``; ``SSL``: TLS, the brokers' certificate checked against ``cafile``
      (PEM) or, when None, the JVM's trust store (MSK's certificates chain to public roots);
    - ``SASL_SSL`` with ``SCRAM-SHA-512``: TLS as ``SSL``, then ``username`` / ``password``;
    - ``SASL_SSL`` with ``OAUTHBEARER`` (MSK IAM): TLS, then ``AWS_MSK_IAM`` with the job's
      IAM role (no secret).

    Returns a new dict of option name → value (the password sits in
    :data:`JAAS_CONFIG`: never log it, see :func:`redacted`). Raises ``ValueError`` for an
    empty ``bootstrap``, an unknown protocol or mechanism, or SCRAM without both
    credentials.
    """
    if not bootstrap.strip():
        raise ValueError("the Kafka bootstrap address is empty")
    if protocol not in ("PLAINTEXT", "SSL", "SASL_SSL"):
        raise ValueError(
            f"unknown Kafka security protocol {protocol!r}: PLAINTEXT, SSL or SASL_SSL"
        )
    options = {"kafka.bootstrap.servers": bootstrap, "kafka.security.protocol": protocol}
    if protocol != "PLAINTEXT" and cafile is not None:
        options |= {
            "kafka.ssl.truststore.type": "PEM",
            "kafka.ssl.truststore.location": str(cafile),
        }
    if protocol != "SASL_SSL":
        return options
    if mechanism == "SCRAM-SHA-512":
        if not username or not password:
            raise ValueError("SCRAM-SHA-512 authentication needs a user name and a password")
        options |= {
            "kafka.sasl.mechanism": mechanism,
            JAAS_CONFIG: (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f"username={_jaas_quote(username)} password={_jaas_quote(password)};"
            ),
        }
    elif mechanism == "OAUTHBEARER":
        options |= {
            "kafka.sasl.mechanism": "AWS_MSK_IAM",
            JAAS_CONFIG: "software.amazon.msk.auth.iam.IAMLoginModule required;",
            "kafka.sasl.client.callback.handler.class": (
                "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
            ),
        }
    else:
        raise ValueError(f"unknown SASL mechanism {mechanism!r}: SCRAM-SHA-512 or OAUTHBEARER")
    return options


def kafka_options_of(settings: Settings, bootstrap: str | None = None) -> dict[str, str]:
    """:func:`kafka_options` of ``settings``' Kafka security settings, to ``bootstrap``
    (default: ``settings.kafka_bootstrap``). Raises ``ValueError`` as it does."""
    password = settings.kafka_sasl_password
    return kafka_options(
        bootstrap or settings.kafka_bootstrap,
        settings.kafka_security_protocol,
        settings.kafka_sasl_mechanism,
        username=settings.kafka_sasl_username,
        password=None if password is None else password.get_secret_value(),
        cafile=settings.kafka_ssl_cafile,
    )


def redacted(options: dict[str, str]) -> dict[str, str]:
    """``options`` with the JAAS configuration (it may hold a password) replaced by ``***``."""
    return {k: ("***" if k == JAAS_CONFIG else v) for k, v in options.items()}
