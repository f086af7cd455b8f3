"""What an integration's status says, shared by the integrations stage that knows it and
the admin service that shows it (docs/integrations/index.md, "Status and monitoring").

A runner is in one :class:`RunnerState`; the admin service adds what only PostgreSQL knows
(:data:`DISABLED`) or what no stage says (:data:`NOT_RUNNING`). The text of a runner's last
error (:func:`error_text`) is served in the stage's ``/metrics`` and shown by the admin API
and the console: it is cut to :data:`ERROR_TEXT_MAX` characters and holds no secret, neither
a value of the integration's secrets (:func:`secret_values`) nor the user information of a
URL.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Final

from services.common.integrations.model import Integration

ERROR_TEXT_MAX = 200
"""Characters of an error's text kept (longer ones end with ``…``)."""

REDACTED = "***"
"""What stands for a secret in an error's text."""

DISABLED: Final = "disabled"
"""The status of an integration whose ``enabled`` is false (the stage runs none)."""

NOT_RUNNING: Final = "not running"
"""The status of an enabled integration no integrations stage reports: none runs, or the
one running has not loaded it yet."""

# scheme://user:password@host: what precedes the last "@" of a URL's authority.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_SPACES = re.compile(r"\s+")


class RunnerState(StrEnum):
    """What an integration's runner in one stage process is doing."""

    STARTING = "starting"
    """Connecting to the sink and joining its consumer group on ``msg.all``."""
    RUNNING = "running"
    """Reading ``msg.all`` and writing to the sink."""
    RESTARTING = "restarting"
    """Stopped by an error, waiting out its backoff before it starts again."""


def secret_values(integration: Integration) -> list[str]:
    """Every secret of ``integration``: each text field of its secrets (the Kafka sink's
    SASL password, and whatever other secrets a sink keeps there), those set."""
    secrets = integration.secrets
    return [
        value
        for field in dataclasses.fields(secrets)
        if isinstance(value := getattr(secrets, field.name), str) and value
    ]


def error_text(error: BaseException, secrets: Iterable[str]) -> str:
    """``error`` as one line for operators: its type and message, each of ``secrets`` (as
    written and as Python's ``repr`` escapes it) and a URL's user information replaced by
    :data:`REDACTED`, white space collapsed, cut to :data:`ERROR_TEXT_MAX` characters
    (the secrets are replaced before the cut, so no part of one is left)."""
    kind, message = type(error).__name__, str(error)
    # aiokafka's errors start their message with their type already.
    text = message if message.startswith(kind) else f"{kind}: {message}" if message else kind
    forms = {form for secret in secrets if secret for form in (secret, repr(secret)[1:-1])}
    # The longest first: a secret that holds another is replaced whole.
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    text = _URL_USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)
    text = _SPACES.sub(" ", text).strip()
    if len(text) > ERROR_TEXT_MAX:
        text = text[: ERROR_TEXT_MAX - 1] + "…"
    return text
