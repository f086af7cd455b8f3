"""How every Kafka client of Cormorant authenticates and encrypts: one function of the settings.

:func:`client_security` turns the settings into aiokafka's client options, and
:func:`faust_credentials` into the same for a Faust app. Every Kafka client the services
create (the Faust apps' producers, the hot-path consumers, the compacted-topic readers, the
admin clients) gets them, so a deployment switches all of them at once:

- ``PLAINTEXT`` (the local cluster): no TLS, no login;
- ``SSL``: TLS, the brokers' certificate checked against ``kafka_ssl_cafile`` or the
  system's trust store, host name included;
- ``SASL_SSL`` with ``SCRAM-SHA-512`` (MSK's port 9096): TLS, then a SCRAM login with
  ``kafka_sasl_username`` and ``kafka_sasl_password``;
- ``SASL_SSL`` with ``OAUTHBEARER`` (MSK IAM, port 9098): TLS, then a token that is an
  AWS SigV4-signed ``kafka-cluster:Connect`` request (aws-msk-iam-sasl-signer), made from
  the task's own AWS credentials; no secret to store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiokafka.abc import AbstractTokenProvider

from services.common.settings import Settings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

#: Seconds before an MSK IAM token's expiry at which a new one is signed.
TOKEN_REFRESH_MARGIN_SECONDS = 60.0

#: The STS role session name of an assumed role's MSK IAM tokens (in the other account's
#: CloudTrail).
DEFAULT_SESSION_NAME = "cormorant"

# botocore's SigV4 signer logs the canonical request and the signature at DEBUG: together
# they are an MSK IAM token, a credential for 15 minutes. They never reach the logs, whatever
# the services' log level.
logging.getLogger("botocore.auth").setLevel(logging.INFO)


class KafkaSecurityError(ValueError):
    """The Kafka security settings are incomplete (named), e.g. SCRAM without a password."""


def tls_context(cafile: Path | None) -> ssl.SSLContext:
    """A client TLS context that verifies the server's certificate chain and host name,
    against ``cafile`` (PEM) or, when None, the system's trust store. TLS 1.2 or newer.

    Raises ``OSError``/``ssl.SSLError`` when ``cafile`` cannot be read."""
    context = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class MskIamTokenProvider(AbstractTokenProvider):  # type: ignore[misc]
    """SASL/OAUTHBEARER tokens for Amazon MSK IAM authentication, for aiokafka.

    A token is a base64url SigV4-presigned ``kafka-cluster:Connect`` request for ``region``
    (``eu-west-1``) signed with the default AWS credentials (ECS: the task role), valid 15
    minutes. With ``role_arn`` (``arn:aws:iam::<account>:role/<name>``: a cluster of
    another account), those credentials first assume that role (STS AssumeRole, session
    ``session_name``, 2 to 64 of ``[A-Za-z0-9+=,.@_-]``) and the token is signed with the
    role's. Signing is local; the credentials may come from the ECS credentials endpoint
    or STS, so it runs in a worker thread. A token is reused until
    :data:`TOKEN_REFRESH_MARGIN_SECONDS` before it expires, and its ``repr`` never shows
    it.
    """

    def __init__(
        self, region: str, role_arn: str | None = None, session_name: str = DEFAULT_SESSION_NAME
    ) -> None:
        self.region = region
        self.role_arn = role_arn
        self.session_name = session_name
        self._token = ""
        self._expires_at = 0.0

    def __repr__(self) -> str:
        return (
            f"MskIamTokenProvider(region={self.region!r}, role_arn={self.role_arn!r}, "
            f"session_name={self.session_name!r})"
        )

    def _sign(self) -> tuple[str, int]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        if self.role_arn is None:
            signed: tuple[str, int] = MSKAuthTokenProvider.generate_auth_token(self.region)
        else:
            signed = MSKAuthTokenProvider.generate_auth_token_from_role_arn(
                self.region, self.role_arn, self.session_name
            )
        return signed

    async def token(self) -> str:
        """A valid token (``str``). Raises ``botocore`` errors when there are no AWS
        credentials or the role cannot be assumed (``ClientError`` ``AccessDenied``)."""
        if time.time() >= self._expires_at - TOKEN_REFRESH_MARGIN_SECONDS:
            token, expiry_ms = await asyncio.to_thread(self._sign)
            self._token, self._expires_at = token, expiry_ms / 1000
        return self._token


def _iam_region(settings: Settings) -> str:
    region = (
        settings.kafka_iam_region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
    )
    if not region:
        raise KafkaSecurityError(
            "OAUTHBEARER (MSK IAM) needs a region: CORMORANT_KAFKA_IAM_REGION or AWS_REGION"
        )
    return region


def _scram_login(settings: Settings) -> tuple[str, str]:
    if not settings.kafka_sasl_username or settings.kafka_sasl_password is None:
        raise KafkaSecurityError(
            "SCRAM-SHA-512 needs CORMORANT_KAFKA_SASL_USERNAME and CORMORANT_KAFKA_SASL_PASSWORD"
        )
    return settings.kafka_sasl_username, settings.kafka_sasl_password.get_secret_value()


def client_security(settings: Settings) -> dict[str, Any]:
    """The security options of an aiokafka client (producer, consumer or admin) for
    ``settings``: ``security_protocol`` and, as it requires, ``ssl_context``,
    ``sasl_mechanism``, ``sasl_plain_username``/``sasl_plain_password`` or
    ``sasl_oauth_token_provider``. Nothing is connected.

    Raises :class:`KafkaSecurityError` when the settings lack what the protocol needs, and
    ``OSError``/``ssl.SSLError`` when the CA file cannot be read.
    """
    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return {"security_protocol": "PLAINTEXT"}
    options: dict[str, Any] = {
        "security_protocol": protocol,
        "ssl_context": tls_context(settings.kafka_ssl_cafile),
    }
    if protocol == "SASL_SSL":
        options["sasl_mechanism"] = settings.kafka_sasl_mechanism
        if settings.kafka_sasl_mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = MskIamTokenProvider(_iam_region(settings))
        else:
            username, password = _scram_login(settings)
            options["sasl_plain_username"] = username
            options["sasl_plain_password"] = password
    return options


def faust_credentials(settings: Settings) -> CredentialsT | None:
    """:func:`client_security` as a Faust app's ``broker_credentials`` (None: PLAINTEXT).
    Faust hands them to the aiokafka clients it creates (its producer)."""
    # Imported here, not with the module: the ``cormorant`` command reaches this module
    # (the local cluster's Kafka) and would pay for importing Faust at every start.
    from faust.auth import OAuthCredentials, SASLCredentials, SSLCredentials

    options = client_security(settings)
    protocol = options["security_protocol"]
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return SSLCredentials(options["ssl_context"])
    if options["sasl_mechanism"] == "OAUTHBEARER":
        return OAuthCredentials(
            oauth_cb=options["sasl_oauth_token_provider"], ssl_context=options["ssl_context"]
        )
    return SASLCredentials(
        username=options["sasl_plain_username"],
        password=options["sasl_plain_password"],
        ssl_context=options["ssl_context"],
        mechanism=options["sasl_mechanism"],
    )
