"""The documentation site's generated references, made at every ``mkdocs build`` (a mkdocs
hook: mkdocs.yml ``hooks``), so a reference cannot go stale: it is read from the code each time.

A page asks for a reference with a marker line, replaced by Markdown:

- ``<!-- cormorant:settings -->``: every setting of ``Settings`` (services), ``LocalSettings``
  (the local cluster launcher) and ``AnalyticsSettings`` (the analytics commands), with its
  environment variable, default and ``description=`` (the groups ``cormorant settings`` lists);
- ``<!-- cormorant:metrics -->``: every ``cormorant_*`` metric family a service builds (read
  from the sources under ``services/``: the families are built when Prometheus scrapes, by
  collect functions the running services register), and the standard families of the
  prometheus-client collectors in ``services.common.metrics.REGISTRY``;
- ``<!-- cormorant:openapi -->``: the admin API's OpenAPI document (FastAPI's ``app.openapi()``
  of :func:`services.admin.api.create_app`), its operations and schemas as Markdown.

The benchmark charts under ``bench/results/`` are served as ``bench-results/...`` (the site's
pages show them; they stay where the benchmarks write them).

Raises ``ValueError`` (failing the build) on a marker no generator knows.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- cormorant:([a-z-]+) -->$", re.MULTILINE)
FAMILY_TYPES = {
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
    "histogram_family": "histogram",
}


def _cell(text: str) -> str:
    """``text`` fit for one cell of a Markdown table: one line, pipes escaped, and angle
    brackets as entities (``msg.downlink.<node_id>`` is text, not an HTML tag)."""
    text = " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|")


def _default(info: FieldInfo) -> str:
    """A setting's default as the environment variable would spell it, or "(none)"."""
    if info.default_factory is not None:
        return "(computed)"
    if info.is_required():
        return "(required)"
    value = info.default
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list | tuple | dict):
        return f"`{json.dumps(value, default=str)}`"
    return f"`{value}`" if str(value) != "" else '`""`'


def settings_reference() -> str:
    """Tables of every setting, grouped as ``cormorant settings`` groups them."""
    from services.common.settings import Settings
    from services.local.settings import LocalSettings
    from spark_emr.settings import AnalyticsSettings

    groups = {
        "Services (`services/common/settings.py`)": list(Settings.model_fields),
        "Local cluster (`services/local/settings.py`)": [
            n for n in LocalSettings.model_fields if n not in Settings.model_fields
        ],
        "Analytics (`spark_emr/settings.py`)": [
            n for n in AnalyticsSettings.model_fields if n not in LocalSettings.model_fields
        ],
    }
    out: list[str] = []
    for title, names in groups.items():
        out += [f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        for name in names:
            info = AnalyticsSettings.model_fields[name]
            meaning = _cell(info.description or "")
            out.append(f"| `CORMORANT_{name.upper()}` | {_default(info)} | {meaning} |")
        out.append("")
    return "\n".join(out)


def _labels(call: ast.Call) -> list[str]:
    """The literal ``labels=[...]`` of a metric family's constructor call, or none."""
    for keyword in call.keywords:
        if keyword.arg == "labels" and isinstance(keyword.value, ast.List):
            return [str(e.value) for e in keyword.value.elts if isinstance(e, ast.Constant)]
    return []


def _families(tree: ast.AST) -> Iterator[tuple[str, str, str, list[str]]]:
    """(name, type, help, labels) of each metric family built in ``tree`` with literal
    arguments, and of the (name, ..., help) tuples a loop builds families from."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            kind = FAMILY_TYPES.get(called)
            if kind is None or len(node.args) < 2:
                continue
            name, documentation = node.args[0], node.args[1]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            labels = _labels(node)
            if called == "histogram_family" and len(node.args) >= 4:
                labels = [str(node.args[3].value)] if isinstance(node.args[3], ast.Constant) else []
            text = documentation.value if isinstance(documentation, ast.Constant) else ""
            yield name.value, kind, str(text), labels
        elif isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            calls = [
                c
                for c in ast.walk(node)
                if isinstance(c, ast.Call)
                and isinstance(c.func, ast.Name)
                and c.func.id in FAMILY_TYPES
            ]
            if not calls:
                continue
            call = calls[0]
            kind = FAMILY_TYPES[cast(ast.Name, call.func).id]
            labels = _labels(call)
            for element in node.iter.elts:
                if not isinstance(element, ast.Tuple):
                    continue
                strings = [e.value for e in element.elts if isinstance(e, ast.Constant)]
                if len(strings) >= 2 and str(strings[0]).startswith("cormorant_"):
                    yield str(strings[0]), kind, str(strings[-1]), labels


def metrics_reference() -> str:
    """A table of every ``cormorant_*`` family (by the file that builds it) and of the
    standard families the registry's own collectors serve."""
    from services.common.metrics import REGISTRY

    rows: dict[str, tuple[str, str, list[str], str]] = {}
    for path in sorted((ROOT / "services").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name, kind, documentation, labels in _families(tree):
            if name.startswith("cormorant_"):
                exposed = f"{name}_total" if kind == "counter" else name
                rows.setdefault(exposed, (kind, documentation, labels, str(path.relative_to(ROOT))))
    out = [
        "## Cormorant's families",
        "",
        "| metric | type | labels | meaning | built in |",
        "|---|---|---|---|---|",
    ]
    for name, (kind, documentation, labels, source) in sorted(rows.items()):
        label_text = ", ".join(f"`{label}`" for label in labels) or "-"
        out.append(f"| `{name}` | {kind} | {label_text} | {_cell(documentation)} | `{source}` |")
    out += [
        "",
        "## The process's standard families",
        "",
        "Served by prometheus-client's process, platform and garbage collector collectors.",
        "",
        "| metric | type | meaning |",
        "|---|---|---|",
    ]
    for family in REGISTRY.collect():
        if not family.name.startswith("cormorant_"):
            name = f"{family.name}_total" if family.type == "counter" else family.name
            out.append(f"| `{name}` | {family.type} | {_cell(family.documentation)} |")
    out.append("")
    return "\n".join(out)


def _schema_type(schema: dict[str, Any]) -> str:
    """A short type of a JSON schema: ``integer``, ``string | null``, a ``Ref`` name..."""
    if "$ref" in schema:
        ref = str(schema["$ref"]).rsplit("/", 1)[-1]
        return f"[{ref}](#{ref.lower()})"
    if "anyOf" in schema:
        return " \\| ".join(_schema_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(schema.get("type", "any"))


def openapi_reference() -> str:
    """The admin API's operations (by tag) and its schemas, from its OpenAPI document."""
    from services.admin.api import AdminContext, create_app
    from services.common.settings import Settings

    # The document describes routes and models only: no handler runs, so the context's
    # servers are never reached.
    context = SimpleNamespace(settings=Settings())
    for field in AdminContext.__dataclass_fields__:
        if field != "settings":
            setattr(context, field, None)
    document = create_app(cast(AdminContext, context)).openapi()
    out = [
        f"OpenAPI {document['openapi']}, {document['info']['title']} "
        f"{document['info']['version']}.",
        "",
    ]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            out += [f"### `{method.upper()} {path}`", ""]
            description = operation.get("description") or operation.get("summary", "")
            out += [" ".join(description.split()), ""]
            if not operation.get("security"):
                out += ["No token needed.", ""]
            parameters = operation.get("parameters", [])
            if parameters:
                out += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
                for parameter in parameters:
                    required = " (required)" if parameter.get("required") else ""
                    kind = _schema_type(parameter.get("schema", {}))
                    meaning = _cell(parameter.get("description", ""))
                    out.append(
                        f"| `{parameter['name']}`{required} | {parameter['in']} | {kind} "
                        f"| {meaning} |"
                    )
                out.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                out += [f"Body ({media}): {_schema_type(content.get('schema', {}))}", ""]
            responses = []
            for code, response in operation.get("responses", {}).items():
                schema = response.get("content", {}).get("application/json", {}).get("schema")
                kind = f": {_schema_type(schema)}" if schema else ""
                text = _cell(response.get("description", "")).rstrip(".")
                responses.append(f"`{code}` {text}{kind}")
            out += ["Responses: " + "; ".join(responses) + ".", ""]
    out += ["## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [" ".join(schema["description"].split()), ""]
        properties = schema.get("properties", {})
        if properties:
            out += ["| field | type | meaning |", "|---|---|---|"]
            for field, spec in properties.items():
                required = " (required)" if field in schema.get("required", []) else ""
                meaning = _cell(spec.get("description", ""))
                out.append(f"| `{field}`{required} | {_schema_type(spec)} | {meaning} |")
            out.append("")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "settings": settings_reference,
    "metrics": metrics_reference,
    "openapi": openapi_reference,
}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Serve the benchmark charts (``bench/results/**/*.png``) as ``bench-results/...``."""
    results = ROOT / "bench" / "results"
    for chart in sorted(results.rglob("*.png")):
        uri = "bench-results/" + chart.relative_to(results).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(chart)))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace each ``<!-- cormorant:NAME -->`` line of ``markdown`` by its reference."""

    def generate(match: re.Match[str]) -> str:
        generator = GENERATORS.get(match.group(1))
        if generator is None:
            raise ValueError(f"{page.file.src_uri}: no generated reference {match.group(1)!r}")
        return generator()

    return MARKER.sub(generate, markdown)
