"""The ECS tasks' environment, written in Cormorant's own settings (services/common/settings.py).

A task's configuration is a set of settings by name (``kafka_bootstrap``); each becomes its
environment variable (``CORMORANT_KAFKA_BOOTSTRAP``) through the settings' own prefix, and
the whole set is validated by the settings model the service itself will use, so a value
the service would refuse fails ``pulumi up`` instead of a task start. Secret settings
(pydantic ``SecretStr``: passwords and tokens) never take a value here: they are ECS
``secrets``, references to Secrets Manager that ECS resolves when it starts the task.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pulumi
from pydantic import SecretStr

from cormorant_infra import shared

EnvironmentEntry = dict[str, str]
"""``{"name": "CORMORANT_...", "value": "..."}`` (or ``"valueFrom"`` for a secret)."""


def is_secret_setting(name: str) -> bool:
    """Whether setting ``name`` holds a secret (its type is ``SecretStr``)."""
    annotation = shared.Settings.model_fields[name].annotation
    return annotation is SecretStr or SecretStr in getattr(annotation, "__args__", ())


def _text(value: Any) -> str:
    """A setting's value as its environment variable holds it (lists as JSON, as
    pydantic-settings reads them; booleans lowercase)."""
    if isinstance(value, list | dict):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def environment(
    settings: Mapping[str, pulumi.Input[Any]], secret_settings: Iterable[str] = ()
) -> pulumi.Output[list[EnvironmentEntry]]:
    """The ECS ``environment`` of ``settings`` (setting name → value, values may be
    outputs), sorted by name.

    Raises ``KeyError`` for a name that is no setting and ``ValueError`` for a secret
    setting (those go through :func:`secrets`). Once every value is known, the set is
    validated as the service will read it (``pydantic.ValidationError`` fails the update),
    with the settings named in ``secret_settings`` (ECS secrets, unknown here) present.
    """
    for name in settings:
        shared.setting_env(name)
        if is_secret_setting(name):
            raise ValueError(f"{name} is a secret: pass it as an ECS secret, not a value")

    present = {name: "<from Secrets Manager>" for name in secret_settings}

    def entries(resolved: dict[str, Any]) -> list[EnvironmentEntry]:
        shared.settings_for(**present, **resolved)
        return [
            {"name": shared.setting_env(name), "value": _text(value)}
            for name, value in sorted(resolved.items())
        ]

    return pulumi.Output.all(**dict(settings)).apply(entries)


def secrets(references: Mapping[str, pulumi.Input[str]]) -> list[dict[str, pulumi.Input[str]]]:
    """The ECS ``secrets`` of ``references`` (setting name → Secrets Manager ``valueFrom``:
    a secret ARN, or ``<arn>:<json key>::``), sorted by name. Raises ``KeyError`` for a name
    that is no setting."""
    return [
        {"name": shared.setting_env(name), "valueFrom": reference}
        for name, reference in sorted(references.items())
    ]
