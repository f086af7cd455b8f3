"""The alerting rules (``monitoring/prometheus/rules.yml``): Prometheus accepts them
(``promtool check rules``), they fire in their scenarios and stay quiet in calm ones
(``promtool test rules`` over ``rules_test.yml``), both scrape configurations load them, and
every alert links a runbook page of the documentation site that exists and is in its nav."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "monitoring" / "prometheus"
RUNBOOKS = ROOT / "docs" / "operations" / "runbooks"
RUNBOOK_URL = "{{ $externalLabels.docs_url }}/operations/runbooks/%s/"


def promtool(*args: str) -> str:
    """Run ``promtool`` with ``args`` in ``monitoring/prometheus``; its output (it must
    succeed)."""
    result = subprocess.run(
        ["promtool", *args], cwd=PROMETHEUS, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_prometheus_accepts_the_rules_and_their_unit_tests_pass() -> None:
    assert "SUCCESS: 7 rules found" in promtool("check", "rules", "rules.yml")
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yml")


def test_every_alert_is_tested_and_links_its_runbook() -> None:
    rules = yaml.safe_load((PROMETHEUS / "rules.yml").read_text(encoding="utf-8"))
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    tests = yaml.safe_load((PROMETHEUS / "rules_test.yml").read_text(encoding="utf-8"))
    tested = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"]}
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    names = {alert["alert"] for alert in alerts}
    assert tested == fired == names
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for alert in alerts:
        name = alert["alert"]
        assert alert["annotations"]["runbook_url"] == RUNBOOK_URL % name
        page = RUNBOOKS / f"{name}.md"
        assert page.is_file(), page
        text = page.read_text(encoding="utf-8")
        assert text.startswith(f"# {name}\n"), page
        for section in ("## What it means", "## How to check", "## What to do"):
            assert section in text, f"{page}: {section}"
        assert f"operations/runbooks/{name}.md" in nav, name
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == sorted(names)


@pytest.mark.parametrize("name", ["local", "ecs"])
def test_the_scrape_configurations_load_the_rules(name: str) -> None:
    config = yaml.safe_load((PROMETHEUS / f"{name}.yml").read_text(encoding="utf-8"))
    assert config["rule_files"] == ["rules.yml"]
