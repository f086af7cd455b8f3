"""Who a connection is, and what authentication answers: the data the sans-IO ingest core
and the authentication shell (:mod:`.authenticate`) exchange."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from services.common.auth.authorize import Rule
from services.common.auth.certificates import CertificateIdentity
from services.common.auth.credentials import Credential, client_id_bound
from services.common.auth.scram import ScramExchange
from services.common.metrics import reason_name
from services.common.records import ClientKind
from services.common.sessions import owner_of


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What a CONNECT (or AUTH) presents: ``client_id`` (the assigned one for a v5 client
    that sent none), ``username`` and ``password`` as sent (None if absent), the verified
    TLS ``certificate`` of the connection (None on plain TCP), for enhanced
    authentication the Authentication ``method`` and ``data`` of the packet, and the
    client's IP ``address`` (its PROXY header's when there is one; None if unknown), which
    failures are counted against."""

    client_id: str
    username: str | None = None
    password: bytes | None = None
    certificate: CertificateIdentity | None = None
    method: str | None = None
    data: bytes | None = None
    address: str | None = None


def host_of(client_address: str) -> str | None:
    """The IP address of a ``host:port`` / ``[host]:port`` client address (None if ``""``)."""
    return client_address.rsplit(":", 1)[0].strip("[]") or None


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection is, once authenticated: its credential (``credential_id``,
    ``credential_name``, ``revision``; None for an anonymous client), its ``kind`` (None:
    anonymous, the ``application_client_ids`` setting decides), its ``rules``, the
    user name ``${username}`` stands for, whether ``${client_id}`` may stand for the
    connection's Client Identifier (``client_id_bound``: the credential is tied to it,
    :func:`~.credentials.client_id_bound`, or anonymous clients under the operator's own
    rules; otherwise allow rules naming it match nothing), whether its SUBSCRIBEs are
    decided strictly (``strict_subscribe``: :class:`~.credentials.Credential`), and the
    session owner of a client let in by an external authority without a stored credential
    (``external_owner``: the HTTP authentication provider's, :mod:`.http_provider`)."""

    credential_id: uuid.UUID | None
    credential_name: str | None
    kind: ClientKind | None
    rules: tuple[Rule, ...]
    username: str | None
    revision: int = 0
    client_id_bound: bool = False
    strict_subscribe: bool = False
    external_owner: str | None = None

    @property
    def owner(self) -> str:
        """The owner its sessions record: ``external_owner`` for a client an external
        authority let in (the HTTP authentication provider, :mod:`.http_provider`, which
        has no stored credential to name), else :func:`~services.common.sessions.owner_of`
        its credential."""
        if self.external_owner is not None:
            return self.external_owner
        return owner_of(self.credential_id)


@dataclass(frozen=True, slots=True)
class Accepted:
    """Authenticated as ``principal``; ``data`` is the Authentication Data CONNACK (or the
    closing AUTH of a re-authentication) carries: SCRAM's server-final-message."""

    principal: Principal
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """Refused with ``reason_code`` (an MQTT 5.0 CONNACK Reason Code); ``reason`` is for the
    log, the client.events record and the v5 Reason String: never a password or token."""

    reason_code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Challenge:
    """Enhanced authentication goes on: send AUTH 0x18 Continue authentication with
    ``data``, and hand ``exchange`` back with the client's answer."""

    data: bytes
    exchange: ScramState


Outcome = Accepted | Refused | Challenge
"""What :meth:`Authenticator.authenticate` answers."""


@dataclass(slots=True)
class ScramState:
    """A SCRAM exchange between its two client messages: the sans-IO exchange and the
    credential it is for (None: the user name has none; the proof will fail)."""

    exchange: ScramExchange
    credential: Credential | None


def principal_of(credential: Credential, username: str | None) -> Principal:
    """The principal of a client authenticated with ``credential`` as ``username``."""
    return Principal(
        credential.id,
        credential.name,
        credential.kind,
        credential.rules,
        username,
        credential.revision,
        client_id_bound(credential),
        credential.strict_subscribe,
    )


def presented(request: AuthRequest) -> str:
    """What ``request`` presents, as the metrics' ``method`` label: its Authentication
    Method lower-cased (``scram-sha-256``), else ``password`` (a User Name or Password,
    a JWT included), else ``certificate`` (a verified TLS client certificate alone), else
    ``anonymous``."""
    if request.method is not None:
        return request.method.lower()
    if request.username is not None or request.password is not None:
        return "password"
    return "certificate" if request.certificate is not None else "anonymous"


def outcome_name(outcome: Outcome) -> str:
    """``outcome`` as the metrics' ``outcome`` label: ``success``, ``challenge``, or the
    refusal's Reason Code in the specification's words (``not_authorized``)."""
    if isinstance(outcome, Accepted):
        return "success"
    if isinstance(outcome, Challenge):
        return "challenge"
    return reason_name(outcome.reason_code)
