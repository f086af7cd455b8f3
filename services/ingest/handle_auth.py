"""Authentication on a connection: the outcome of a CONNECT's check, the AUTH packet of MQTT 5
enhanced authentication and re-authentication (MQTT 5.0 3.15, 4.12), and credentials that
change while the client is connected.

The core asks, the shell checks: CONNECT (:func:`~services.ingest.handle_connect.handle_connect`)
and every AUTH the client sends become an :class:`~services.ingest.effects.Authenticate`
effect; the shell reports the outcome (:func:`connect_outcome` before CONNACK,
:func:`reauth_outcome` on a connected client).

Rules of the exchange: AUTH is a Protocol Error from a client whose CONNECT named no
Authentication Method [MQTT-4.12.0-7], or whose AUTH is not the answer the server waits for;
an AUTH naming another method is refused with 0x8C Bad authentication method; a client
that started enhanced authentication sends nothing but AUTH or DISCONNECT before CONNACK
[MQTT-3.1.2-30]. Every AUTH the server sends, and a successful CONNACK, name the CONNECT's
method [MQTT-4.12.0-5]. A failed re-authentication ends the connection with DISCONNECT
0x87 [MQTT-4.12.1-2].
"""

from __future__ import annotations

import logging

from services.common.auth.principal import (
    Accepted,
    AuthRequest,
    Challenge,
    Outcome,
    Principal,
    Refused,
)
from services.common.mqtt.errors import MQTTError, ProtocolError
from services.common.mqtt.packets import Auth
from services.common.mqtt.properties import Properties
from services.common.mqtt.reason_codes import ReasonCode
from services.ingest.effects import Authenticate, Effect, Send
from services.ingest.handle_connect import admit, authorizer_of, keep_authorized_subscriptions
from services.ingest.state import ConnectionState, Phase

log = logging.getLogger(__name__)

REFUSALS = {
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: "bad user name or password",
    ReasonCode.NOT_AUTHORIZED: "not authorized",
    ReasonCode.BANNED: "banned",
    ReasonCode.BAD_AUTHENTICATION_METHOD: "bad authentication method",
    ReasonCode.SERVER_UNAVAILABLE: "server unavailable",
    ReasonCode.SERVER_BUSY: "server busy",
    ReasonCode.CONNECTION_RATE_EXCEEDED: "connection rate exceeded",
}
"""What the client is told (v5 Reason String) for each refusal: the same words whatever the
detail, so that a wrong password and an unknown user name look alike."""


def _told(reason_code: int) -> str:
    return REFUSALS.get(ReasonCode(reason_code), "refused")


def _auth(state: ConnectionState, reason_code: int, data: bytes | None) -> Send:
    props = Properties(authentication_method=state.auth_method, authentication_data=data)
    return Send(state.encode(Auth(reason_code, props)))


def connect_outcome(state: ConnectionState, outcome: Outcome) -> list[Effect]:
    """The outcome of the CONNECT's check (or of its SCRAM exchange's last step): admit the
    client, or send AUTH 0x18 Continue authentication and wait for its answer.

    Raises :class:`MQTTError` with the CONNACK Reason Code for a refusal (logged here with
    the client's address and the detailed reason; the client gets the Reason Code and the
    words of :data:`REFUSALS`).
    """
    if isinstance(outcome, Refused):
        log.info(
            "CONNECT refused: client %r from %s: %s (0x%02X)",
            state.client_id,
            state.client_address,
            outcome.reason,
            outcome.reason_code,
        )
        raise MQTTError(_told(outcome.reason_code), outcome.reason_code)
    if isinstance(outcome, Challenge):
        state.auth_state = outcome.exchange
        return [_auth(state, ReasonCode.CONTINUE_AUTHENTICATION, outcome.data)]
    return admit(state, outcome.principal, outcome.data)


def handle_auth(state: ConnectionState, packet: Auth) -> list[Effect]:
    """An AUTH packet from the client, before CONNACK (the answer to the server's
    challenge) or after it (0x19 starts a re-authentication, 0x18 answers its challenge).

    Raises :class:`ProtocolError` when AUTH is not expected, :class:`MQTTError` 0x8C when it
    names another Authentication Method than the CONNECT's.
    """
    if state.auth_method is None:
        raise ProtocolError("AUTH from a client that did not use enhanced authentication")
    method = packet.properties.authentication_method
    if method != state.auth_method:
        raise MQTTError(
            "AUTH names another authentication method", ReasonCode.BAD_AUTHENTICATION_METHOD
        )
    request = AuthRequest(
        state.client_id,
        state.principal.username if state.principal else None,
        None,
        state.certificate,
        method,
        packet.properties.authentication_data,
    )
    code = packet.reason_code
    if code == ReasonCode.RE_AUTHENTICATE:
        if state.phase is not Phase.CONNECTED or state.reauthenticating:
            raise ProtocolError("Re-authenticate while an authentication is under way")
        state.reauthenticating = True
        return [Authenticate(request)]
    waiting = state.auth_state
    if code != ReasonCode.CONTINUE_AUTHENTICATION or waiting is None:
        raise ProtocolError("AUTH the server did not ask for")
    state.auth_state = None
    return [Authenticate(request, waiting)]


def reauth_outcome(state: ConnectionState, outcome: Outcome) -> list[Effect]:
    """The outcome of a re-authentication's check: AUTH 0x18 with the next challenge, or
    AUTH 0x00 Success (the connection now has the principal's rules). Raises
    :class:`MQTTError` 0x87 Not authorized (or the refusal's own code, when it is one
    DISCONNECT can carry) if it failed, or if it authenticated another principal than the
    session's owner; an AUTH_FAILED event records it."""
    if isinstance(outcome, Challenge):
        state.auth_state = outcome.exchange
        return [_auth(state, ReasonCode.CONTINUE_AUTHENTICATION, outcome.data)]
    state.reauthenticating = False
    if isinstance(outcome, Refused):
        log.info(
            "re-authentication refused: client %r from %s: %s (0x%02X)",
            state.client_id,
            state.client_address,
            outcome.reason,
            outcome.reason_code,
        )
        code = outcome.reason_code
        if code not in (ReasonCode.NOT_AUTHORIZED, ReasonCode.BAD_AUTHENTICATION_METHOD):
            code = ReasonCode.NOT_AUTHORIZED  # 0x86 and 0x8A are not DISCONNECT Reason Codes
        raise ReauthenticationFailed(_told(code), code)
    assert isinstance(outcome, Accepted)
    if state.principal is not None and outcome.principal.owner != state.principal.owner:
        # The session belongs to the principal that connected: another one may not take
        # it over by re-authenticating, as it may not by connecting (handle_connect).
        log.warning(
            "re-authentication refused: client %r from %s: %s is not the session's owner %s",
            state.client_id,
            state.client_address,
            outcome.principal.owner,
            state.principal.owner,
        )
        raise ReauthenticationFailed(_told(ReasonCode.NOT_AUTHORIZED), ReasonCode.NOT_AUTHORIZED)
    effects = apply_principal(state, outcome.principal)
    return [_auth(state, ReasonCode.SUCCESS, outcome.data), *effects]


class ReauthenticationFailed(MQTTError):
    """A re-authentication was refused (MQTT 5.0 4.12.1): DISCONNECT, then close."""


def apply_principal(state: ConnectionState, principal: Principal) -> list[Effect]:
    """The connection is now ``principal`` (a re-authentication, or its credential changed
    on another node's command): its rules apply to the next PUBLISH and SUBSCRIBE, the
    subscriptions they no longer grant are dropped, and a Will Message they no longer
    allow is discarded. The kind stays what the session was created with (a new kind
    applies at the next CONNECT)."""
    state.principal = principal
    state.authorizer = authorizer_of(principal, state.client_id)
    if state.will is not None and not state.authorizer.may_publish(state.will.topic):
        log.info("client %r: Will Topic no longer authorized, Will Message discarded",
                 state.client_id)  # fmt: skip
        state.will = None
    return keep_authorized_subscriptions(state)
