"""The spec's machine-readable tables, as files next to the prose.

`hicache.spec` is this directory (`hicache/spec` is a symlink to it, so the installed package
carries the spec). Only loaders live here; the meaning of the tables is in the *.md files
beside them.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

SPEC_DIR = Path(__file__).resolve().parent
LIFECYCLE_TOML = SPEC_DIR / "lifecycle.toml"
POOLS_TOML = SPEC_DIR / "pools.toml"
TP_TOML = SPEC_DIR / "tp.toml"


def load_toml(path: Path) -> dict[str, Any]:
    """Parse one spec table file."""
    with open(path, "rb") as f:
        return tomllib.load(f)
