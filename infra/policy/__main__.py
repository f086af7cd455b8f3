"""The ``cormorant`` policy pack: ``pulumi preview --policy-pack infra/policy`` (docs/deploy.md)."""

import sys
from pathlib import Path

# The rules import the deployment's own facts (cormorant_infra, beside this directory).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from cormorant_policies import POLICIES

PolicyPack(
    name="cormorant",
    description="Cormorant's deployment rules: exposure, encryption, availability, IAM, "
    "logs and scaling, Spark version, keep alive.",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=POLICIES,
)
