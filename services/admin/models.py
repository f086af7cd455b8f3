"""The admin API's request and response bodies (its OpenAPI document's schemas)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from services.admin.users import MIN_PASSWORD_LENGTH, USERNAME
from services.common.auth.credentials import NAME_PATTERN

ProtocolVersion = Literal["3.1", "3.1.1", "5.0", "unknown"]


USERNAME_PATTERN = USERNAME.pattern
"""An admin user name, as the OpenAPI document says it."""


class Problem(BaseModel):
    """An error: what went wrong, in words."""

    detail: str


class LoginRequest(BaseModel):
    """An admin user's name and password."""

    username: str = Field(pattern=USERNAME_PATTERN)
    password: str = Field(min_length=1, max_length=1024)


class NewAdminUser(BaseModel):
    """An admin user to create: name and password (12 characters or more)."""

    username: str = Field(pattern=USERNAME_PATTERN)
    password: str = Field(min_length=MIN_PASSWORD_LENGTH, max_length=1024)


class NewPassword(BaseModel):
    """An admin user's new password (12 characters or more)."""

    password: str = Field(min_length=MIN_PASSWORD_LENGTH, max_length=1024)


class AdminUserList(BaseModel):
    """Every admin user's name, sorted."""

    usernames: list[str]


class TokenResponse(BaseModel):
    """A bearer token: send it as ``Authorization: Bearer <token>``."""

    token: str
    token_type: Literal["bearer"] = "bearer"
    username: str
    expires_at: datetime


class ServiceStatus(BaseModel):
    """One service process as its ``/health``, ``/ready`` and ``/metrics`` tell."""

    name: str = Field(description="The process (ingest-node1, router, an ECS task...).")
    url: str = Field(description="Base URL of its HTTP endpoints.")
    service: str = Field(description="ingest, router, device-persist or app-delivery.")
    node_id: str | None = Field(description="An ingest node's id.")
    version: str
    alive: bool = Field(description="/health answered 200.")
    ready: bool = Field(description="/ready answered 200.")
    checks: dict[str, str] = Field(description="Each readiness check: ok, or what failed.")
    error: str | None = Field(description="Why the process could not be asked, if it could not.")
    connections: int | None = Field(description="Connected MQTT clients (ingest nodes).")
    lag: int | None = Field(description="Records the process's consumers have not handled.")


class ClusterResponse(BaseModel):
    """Every service process, and where the admin service reads Kafka."""

    services: list[ServiceStatus]
    kafka_bootstrap: str
    admin_version: str


class StatsSample(BaseModel):
    """The cluster's figures at one moment."""

    at: datetime
    connections: int = Field(description="Connected MQTT clients, all nodes.")
    msg_in_per_second: float = Field(description="PUBLISH packets accepted per second.")
    msg_out_per_second: float = Field(description="PUBLISH packets sent per second.")
    publish_received_total: float
    publish_sent_total: float
    received_bytes_total: float
    sent_bytes_total: float
    lag: dict[str, float] = Field(description="Records behind, per stage (consumer lag).")


class StatsResponse(BaseModel):
    """The latest sample and those before it (oldest first)."""

    interval_seconds: float
    current: StatsSample | None
    history: list[StatsSample]


class ClientSummary(BaseModel):
    """A session, as the latest ``client.sessions`` record says."""

    client_id: str
    connected: bool
    node_id: str = Field(description="The ingest node holding (or that last held) it.")
    protocol_version: ProtocolVersion
    kind: Literal["DEVICE", "APPLICATION"]
    persistent: bool
    clean_start: bool
    session_expiry_interval: int = Field(description="Seconds (MQTT 5.0 3.1.2.11.2).")
    connected_at: datetime | None = Field(description="When its connection connected.")
    updated_at: datetime | None = Field(description="When the record was written.")
    client_address: str | None = Field(description="The network peer its node saw.")
    subscriptions: int


class ClientPage(BaseModel):
    """One page of clients, and how many match in all."""

    total: int
    offset: int
    limit: int
    items: list[ClientSummary]


class SubscriptionView(BaseModel):
    """One client's subscription to one Topic Filter (MQTT 3.8.3.1)."""

    client_id: str
    topic_filter: str
    qos: int
    no_local: bool
    retain_as_published: bool
    retain_handling: int
    subscription_identifier: int | None


class SessionDetail(ClientSummary):
    """A session with its subscriptions and what waits for it."""

    connection_id: str = Field(description="Hex: the network connection.")
    session_id: str = Field(description="Hex: the session (its first connection's id).")
    receive_maximum: int
    kept_seconds: int | None = Field(
        description="How long the session is kept once disconnected (seconds; null: for "
        "ever, or not at all when it is not persistent), the server's maximum applied."
    )
    subscription_list: list[SubscriptionView]
    stored_messages: int | None = Field(
        description="Messages the DEVICE store holds for a persistent DEVICE session "
        "(null: not such a session, or the store did not answer)."
    )
    dropped_messages: int | None = Field(
        description="Messages the DEVICE store dropped for a persistent DEVICE session, "
        "oldest first, to stay within CORMORANT_PERSISTED_MAX_MESSAGES: their publishers "
        "were acknowledged, the client never gets them. Counted since the session's stored "
        "messages were last deleted (Clean Start, session expiry); null when stored_messages is.",
        ge=0,
    )
    app_lag: int | None = Field(
        description="Records of a connected APPLICATION client's topic not yet acknowledged."
    )


class SubscriptionPage(BaseModel):
    """One page of subscriptions."""

    total: int
    offset: int
    limit: int
    items: list[SubscriptionView]


class RetainedView(BaseModel):
    """A retained message (MQTT 3.3.1.3)."""

    topic: str
    qos: int
    payload_size: int = Field(description="Bytes.")
    payload: str = Field(description="The payload's first 1,024 bytes, as text or base64.")
    payload_encoding: Literal["utf-8", "base64"]
    received_at: datetime


class RetainedPage(BaseModel):
    """One page of retained messages matching a Topic Filter."""

    total: int
    offset: int
    limit: int
    items: list[RetainedView]


class DelayedView(BaseModel):
    """A delayed publication waiting to be published (``$delayed/<seconds>/<topic>``)."""

    id: str = Field(description="Its id (48 hex digits), for DELETE /api/delayed/{id}.")
    client_id: str = Field(description="The Client Identifier that published it.")
    topic: str = Field(description="The Topic Name it will be published to.")
    qos: int
    retain: bool = Field(description="Published as the topic's retained message.")
    payload_size: int = Field(description="Bytes.")
    payload: str = Field(description="The payload's first 1,024 bytes, as text or base64.")
    payload_encoding: Literal["utf-8", "base64"]
    received_at: datetime = Field(description="When the ingest node accepted it.")
    due_at: datetime = Field(description="When it is to be published.")


class DelayedPage(BaseModel):
    """One page of waiting delayed publications, the soonest due first."""

    total: int
    offset: int
    limit: int
    items: list[DelayedView]


class Accepted(BaseModel):
    """A change handed to Kafka (stored with acks=all); the cluster carries it out."""

    action: str
    target: str
    detail: dict[str, Any]


class AuditView(BaseModel):
    """One audited call."""

    id: int
    at: datetime
    username: str
    action: str
    target: str
    detail: dict[str, Any]
    status: int


class AuditPage(BaseModel):
    """One page of the audit trail, newest first."""

    total: int
    offset: int
    limit: int
    items: list[AuditView]


# ------------------------------------------------------------------------- MQTT credentials

CREDENTIAL_NAME_PATTERN = NAME_PATTERN.pattern
"""A credential's name, as the OpenAPI document says it."""

NO_NUL = r"^[^\x00]*$"
"""Text PostgreSQL keeps: no U+0000."""

CredentialTypeName = Literal["MQTT_BASIC", "X509", "JWT", "SCRAM"]
ClientKindName = Literal["DEVICE", "APPLICATION"]


class RuleBody(BaseModel):
    """One authorization rule: ``permission`` for ``action`` on the topics ``topic``
    matches (a Topic Filter; ``${client_id}`` and ``${username}`` may stand for whole
    levels). The first matching rule decides; what no rule allows is denied (no rule at
    all: nothing allowed; ``allow all #`` allows everything)."""

    permission: Literal["allow", "deny"]
    action: Literal["publish", "subscribe", "all"]
    topic: str = Field(min_length=1, max_length=1024, examples=["devices/${client_id}/#"])


class CertificateBody(BaseModel):
    """How an X509 credential recognises its certificate: exactly one of ``fingerprint``
    (SHA-256 of the DER certificate, hex), ``common_name`` (a shell pattern) or ``san``, a
    typed pattern over one type of Subject Alternative Name (``dns:*.devices.example.com``,
    ``uri:spiffe://example.com/*``, ``email:*@example.com``, ``ip:10.0.0.0/8``)."""

    fingerprint: str | None = Field(None, max_length=128, pattern=NO_NUL)
    common_name: str | None = Field(None, min_length=1, max_length=1024, pattern=NO_NUL)
    san: str | None = Field(None, min_length=1, max_length=1024, pattern=NO_NUL)


class JwtBody(BaseModel):
    """What a JWT credential verifies the tokens clients send as Password with: the JWS
    ``algorithms`` (all HMAC, ``key`` the shared secret; or all public-key, ``key`` a PEM
    public key or ``jwks_url`` the ``https://`` URL of the issuer's JSON Web Key Set, whose
    key the token's ``kid`` names), and optionally the ``aud``/``iss`` required and the
    claims that must equal the Client Identifier / User Name."""

    algorithms: list[Annotated[str, Field(max_length=16, pattern=NO_NUL)]] = Field(
        min_length=1, max_length=16
    )
    key: str = Field("", max_length=16384, pattern=NO_NUL)
    jwks_url: str | None = Field(
        None,
        max_length=2048,
        pattern=NO_NUL,
        description="Instead of a key: the https:// URL of the issuer's JSON Web Key Set.",
    )
    audience: str | None = Field(None, max_length=1024, pattern=NO_NUL)
    issuer: str | None = Field(None, max_length=1024, pattern=NO_NUL)
    client_id_claim: str | None = Field(None, max_length=256, pattern=NO_NUL)
    username_claim: str | None = Field(None, max_length=256, pattern=NO_NUL)
    leeway_seconds: int = Field(0, ge=0, le=86400)
    max_age_seconds: int | None = Field(
        None, ge=1, description="Tokens must carry an 'iat' no older than this (seconds)."
    )
    no_audience: bool = Field(
        False,
        description="Public-key algorithms or a JWKS URL: accept tokens without checking "
        "'aud' (else an audience is required).",
    )


class NewCredential(BaseModel):
    """A credential to create. MQTT_BASIC: ``client_id`` and/or ``username``, and a
    ``password`` unless ``no_password`` (then it is recognised by its ``client_id`` alone);
    SCRAM: ``username`` and ``password``; X509: ``certificate``; JWT: ``jwt``. Passwords
    have at least ``credential_password_min_length`` characters (default 12) and are stored
    as argon2id hashes (SCRAM: salted keys), never as given. MQTT_BASIC with
    ``generate_secret`` (no ``password``): the server generates a 256-bit secret, answers
    it once in ``secret`` and stores its salted HMAC-SHA-256 only (fast to verify at every
    CONNECT). Without ``rules`` the credential may do nothing; ``allow_all`` adds
    ``allow all #`` after them.
    ``strict_subscribe``: refuse a SUBSCRIBE overlapping a denied subtree instead of
    withholding the denied topics at delivery."""

    name: str = Field(pattern=CREDENTIAL_NAME_PATTERN)
    type: CredentialTypeName
    kind: ClientKindName = "DEVICE"
    enabled: bool = True
    rules: list[RuleBody] = Field(default_factory=list, max_length=1000)
    strict_subscribe: bool = False
    client_id: str | None = Field(None, min_length=1, max_length=1024)
    username: str | None = Field(None, min_length=1, max_length=1024)
    password: str | None = Field(None, max_length=65535)
    scram_iterations: int | None = Field(
        None,
        ge=4096,
        le=10_000_000,
        description="SCRAM: PBKDF2 iterations (default 600,000 for SCRAM-SHA-256, 210,000 for "
        "SCRAM-SHA-512; every client connect pays them).",
    )
    certificate: CertificateBody | None = None
    jwt: JwtBody | None = None
    allow_all: bool = False
    no_password: bool = False
    generate_secret: bool = False


class CredentialChangesBody(BaseModel):
    """Changes to a credential; a field left out is kept. ``rules`` replaces every rule
    (``[]``: none, nothing allowed), ``allow_all`` adds ``allow all #`` after the new
    rules (or alone); ``password`` replaces the password and
    ``remove_password`` removes it (MQTT_BASIC); ``client_id``/``username`` ``""`` remove
    them (MQTT_BASIC)."""

    kind: ClientKindName | None = None
    enabled: bool | None = None
    rules: list[RuleBody] | None = Field(None, max_length=1000)
    strict_subscribe: bool | None = None
    client_id: str | None = Field(None, max_length=1024)
    username: str | None = Field(None, max_length=1024)
    password: str | None = Field(None, max_length=65535)
    remove_password: bool = False
    certificate: CertificateBody | None = None
    jwt: JwtBody | None = None
    allow_all: bool = False


class CredentialView(BaseModel):
    """A credential as stored, without secrets: ``password`` only says whether one is set,
    an HMAC key is masked, SCRAM keys are left out."""

    id: str
    name: str
    type: CredentialTypeName
    kind: ClientKindName
    enabled: bool
    rules: list[RuleBody]
    strict_subscribe: bool = False
    client_id: str | None = None
    username: str | None = None
    password: Literal["set", "none"] | None = None
    password_scheme: Literal["argon2id", "hmac-sha256"] | None = Field(
        None, description="MQTT_BASIC: how the password is hashed (none: no password)."
    )
    secret: str | None = Field(
        None,
        description="Only in the answer to a creation with generate_secret: the secret, "
        "shown this once.",
    )
    certificate: CertificateBody | None = None
    jwt: JwtBody | None = None
    scram: list[dict[str, Any]] | None = Field(
        None, description="SCRAM mechanisms and iteration counts."
    )
    created_at: datetime | None = None
    updated_at: datetime | None = None


class CredentialList(BaseModel):
    """Credentials, by name."""

    credentials: list[CredentialView]
