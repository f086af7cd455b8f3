"""The Prometheus scrape configuration of a stack, rendered with its private DNS namespace.

``monitoring/prometheus/ecs.yml`` is a template: every service's tasks are found at
``<service>.${SERVICE_DNS_NAMESPACE}`` (Cloud Map, :class:`cormorant_infra.compute.Compute`).
:func:`prometheus_config` puts the stack's namespace there; the stack exports the result as
``prometheusConfig`` (docs/operations/monitoring.md).
"""

from __future__ import annotations

from pathlib import Path

TEMPLATE = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "ecs.yml"
"""The scrape configuration template, in the repository beside the alert rules it loads."""

PLACEHOLDER = "${SERVICE_DNS_NAMESPACE}"
"""What :func:`prometheus_config` replaces in :data:`TEMPLATE` (envsubst's spelling, so the
template renders by hand the same way)."""


def prometheus_config(namespace: str) -> str:
    """:data:`TEMPLATE` with every :data:`PLACEHOLDER` replaced by ``namespace`` (a DNS
    name, ``cormorant-<stack>.internal``). Raises ``ValueError`` for an empty namespace or a
    template without the placeholder; ``OSError`` if the template cannot be read."""
    if not namespace:
        raise ValueError("the private DNS namespace is empty")
    template = TEMPLATE.read_text(encoding="utf-8")
    if PLACEHOLDER not in template:
        raise ValueError(f"{TEMPLATE} has no {PLACEHOLDER}")
    return template.replace(PLACEHOLDER, namespace)
