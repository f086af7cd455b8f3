"""Cormorant on AWS: ``pulumi up`` with this directory's stack files (docs/deploy.md)."""

import pulumi

from cormorant_infra.config import load
from cormorant_infra.stack import build

for key, value in build(load()).items():
    pulumi.export(key, value)
