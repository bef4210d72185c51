"""The conformance-vector files: a case, the manifest, and how both are written and checked.

spec/vectors.md is the normative description; this module is its reader and writer.

    file            holds
    --------------  ------------------------------------------------------------------------
    <case>.json     one case: `config`, `steps` (an operation and its expected observation
                    each), `final` (the page snapshot and live set after the last step)
    manifest.json   the format version, the count of cases per category, and every case
                    file with its sha256 (a runner reads every listed file, and no other)

Files are written canonically (`dumps`: UTF-8, keys in a fixed order, one step per line), so
the same generator arguments give the same bytes. Malformed input raises `VectorFormatError`
naming the file and the field; nothing is half-read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache.controller.config import POLICIES, WRITE_POLICIES
from hicache.core.tiers import MAX_PAGES
from hicache.core.tiers import TIERS as TIER_ENUM
from hicache.errors import HiCacheError
from hicache.testing.factory import EngineConfig
from hicache.testing.factory import UnsupportedConfig as UnsupportedConfig  # its old home

FORMAT = "hicache-vectors"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TIERS = tuple(str(t) for t in TIER_ENUM)  # "L1", "L2", "L3"
CASE_TIERS = (TIERS[:1], TIERS)  # a case is for a one-tier cache or a three-tier one
OPS: dict[str, dict[str, type]] = {
    "submit": {"request": int, "tokens": list},
    "ready": {"request": int},
    "prefill": {"request": int},
    "finish": {"request": int},
    "cancel_restore": {"request": int},
    "tick": {},
    "complete": {"op_index": int},
    "fail": {"op_index": int, "kind": str},
    "evict": {"tier": str, "pages": int},
    "drain": {},
    "aim": {"action": str, "tier": str},
    "damage_storage": {"how": str},
    "restart": {},
}
"""Every operation a step may name, with its arguments' JSON types (spec/vectors.md,
"Operations")."""
EXPECT_KEYS = ("result", "refused", "crashed", "live", "cached_len", "pending_ops", "changes")
"""The observations every step's `expect` holds (spec/vectors.md, "Observations")."""


class VectorFormatError(HiCacheError):
    """A vector file or manifest is not what spec/vectors.md describes; the message names the
    file and field. Regenerate the directory (`hicache vectors generate DIR`) or fix the file."""


CaseConfig = EngineConfig
"""A case's configuration is the `EngineConfig` the adapter's factory is called with
(hicache/testing/factory.py; spec/vectors.md, "Configuration"); its plane is always null."""


def config_to_json(config: CaseConfig) -> dict[str, Any]:
    """A case file's `config` (the plane is not written: a case runs on the null plane)."""
    return {
        "page_size": config.page_size,
        "capacities": {t: config.capacities[t] for t in config.tiers},
        "write_policy": config.write_policy,
        "restore_policy": config.restore_policy,
        "promotion": config.promotion,
    }


def config_from_json(raw: object, where: str) -> CaseConfig:
    """A case file's `config`, each field checked; VectorFormatError naming the field."""
    obj = _object(raw, f"{where}: config")
    page_size = _int(obj.get("page_size"), f"{where}: config.page_size", low=1)
    caps = _object(obj.get("capacities"), f"{where}: config.capacities")
    if tuple(sorted(caps)) not in CASE_TIERS:
        raise VectorFormatError(
            f"{where}: config.capacities: tiers L1 alone or L1, L2 and L3, got {sorted(caps)}"
        )
    capacities = {
        t: _int(caps[t], f"{where}: config.capacities.{t}", low=1, high=MAX_PAGES)
        for t in TIERS
        if t in caps
    }
    strings = {k: obj.get(k) for k in ("write_policy", "restore_policy")}
    for (k, v), allowed in zip(strings.items(), (WRITE_POLICIES, POLICIES)):
        if v not in allowed:
            raise VectorFormatError(f"{where}: config.{k}: one of {list(allowed)}, got {v!r}")
    if not isinstance(obj.get("promotion"), bool):
        raise VectorFormatError(
            f"{where}: config.promotion: true or false, got {obj.get('promotion')!r}"
        )
    return CaseConfig(
        page_size,
        capacities,
        str(strings["write_policy"]),
        str(strings["restore_policy"]),
        bool(obj["promotion"]),
    )


@dataclass(frozen=True)
class Case:
    """One case as read from its file (steps are kept as parsed JSON objects, each checked
    to name a known operation and to carry every observation)."""

    name: str
    category: str
    config: CaseConfig
    steps: list[dict[str, Any]]
    final: dict[str, Any]


@dataclass(frozen=True)
class ManifestEntry:
    file: str
    category: str
    sha256: str


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dumps(obj: dict[str, Any], lines: str | None = None) -> bytes:
    """Canonical JSON: compact, keys in insertion order; the list under key `lines` (the
    steps, or the manifest's cases) one element per line, so a diff shows the step."""
    if lines is None or lines not in obj:
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    head = {k: v for k, v in obj.items() if k != lines}
    parts = [json.dumps(v, separators=(",", ":")) for v in obj[lines]]
    body = json.dumps(head, separators=(",", ":"))[:-1]
    sep = "," if head else ""
    return (body + f'{sep}"{lines}":[\n' + ",\n".join(parts) + "\n]}\n").encode()


def case_json(
    name: str,
    category: str,
    seed: int,
    config: CaseConfig,
    steps: list[dict[str, Any]],
    final: dict[str, Any],
) -> bytes:
    return dumps(
        {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "case": name,
            "category": category,
            "seed": seed,
            "config": config_to_json(config),
            "final": final,
            "steps": steps,
        },
        lines="steps",
    )


def parse_case(data: bytes, where: str) -> Case:
    """A case file's bytes -> `Case`, or VectorFormatError naming `where` and the field."""
    obj = _object(_json(data, where), where)
    _version(obj, FORMAT, where)
    name, category = obj.get("case"), obj.get("category")
    if not isinstance(name, str) or not isinstance(category, str):
        raise VectorFormatError(f"{where}: 'case' and 'category' must be strings")
    config = config_from_json(obj.get("config"), where)
    steps = obj.get("steps")
    if not isinstance(steps, list):
        raise VectorFormatError(f"{where}: 'steps' must be a list")
    for i, step in enumerate(steps):
        s = _object(step, f"{where}: step {i}")
        if s.get("op") not in OPS:
            raise VectorFormatError(
                f"{where}: step {i}: 'op' must be one of {', '.join(OPS)}, got {s.get('op')!r}"
            )
        for arg, kind in OPS[s["op"]].items():
            if not isinstance(s.get(arg), kind) or isinstance(s.get(arg), bool):
                raise VectorFormatError(
                    f"{where}: step {i}: {s['op']} needs {arg!r} ({kind.__name__}), "
                    f"got {s.get(arg)!r}"
                )
        expect = _object(s.get("expect"), f"{where}: step {i}: expect")
        missing = [k for k in EXPECT_KEYS if k not in expect]
        if missing:
            raise VectorFormatError(f"{where}: step {i}: expect lacks {', '.join(missing)}")
    final = _object(obj.get("final"), f"{where}: final")
    for key in ("live", "tiers", "usage"):
        if key not in final:
            raise VectorFormatError(f"{where}: final lacks {key!r}")
    return Case(name, category, config, steps, final)


def manifest_json(entries: list[ManifestEntry], generator: str) -> bytes:
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.category] = counts.get(e.category, 0) + 1
    return dumps(
        {
            "format": FORMAT + "-manifest",
            "version": FORMAT_VERSION,
            "generator": generator,
            "total": len(entries),
            "counts": counts,
            "cases": [
                {"file": e.file, "category": e.category, "sha256": e.sha256} for e in entries
            ],
        },
        lines="cases",
    )


def read_manifest(directory: Path) -> list[ManifestEntry]:
    """The manifest's case list, checked (names are plain file names in `directory`, listed
    once; the counts agree with the list), or VectorFormatError."""
    path = directory / MANIFEST
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise VectorFormatError(
            f"{where}: cannot read the manifest ({e.strerror}); "
            f"is {directory} a directory `hicache vectors generate` wrote?"
        ) from None
    obj = _object(_json(data, where), where)
    _version(obj, FORMAT + "-manifest", where)
    cases = obj.get("cases")
    if not isinstance(cases, list):
        raise VectorFormatError(f"{where}: 'cases' must be a list")
    entries = []
    for i, raw in enumerate(cases):
        c = _object(raw, f"{where}: cases[{i}]")
        file, category, sha = c.get("file"), c.get("category"), c.get("sha256")
        if not (isinstance(file, str) and isinstance(category, str) and isinstance(sha, str)):
            raise VectorFormatError(
                f"{where}: cases[{i}]: 'file', 'category', 'sha256' must be strings"
            )
        if "/" in file or "\\" in file or file in ("", ".", "..", MANIFEST):
            raise VectorFormatError(f"{where}: cases[{i}]: {file!r} is not a plain case file name")
        entries.append(ManifestEntry(file, category, sha))
    if len({e.file for e in entries}) != len(entries):
        raise VectorFormatError(f"{where}: a case file is listed twice")
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.category] = counts.get(entry.category, 0) + 1
    if obj.get("counts") != counts or obj.get("total") != len(entries):
        raise VectorFormatError(f"{where}: 'counts'/'total' disagree with the case list ({counts})")
    return entries


def _json(data: bytes, where: str) -> object:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise VectorFormatError(f"{where}: not UTF-8 JSON ({e})") from None


def _object(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise VectorFormatError(f"{where}: a JSON object expected, got {type(raw).__name__}")
    return raw


def _int(raw: object, where: str, low: int, high: int | None = None) -> int:
    if (
        not isinstance(raw, int)
        or isinstance(raw, bool)
        or raw < low
        or (high is not None and raw > high)
    ):
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise VectorFormatError(f"{where}: an integer {span} expected, got {raw!r}")
    return raw


def _version(obj: dict[str, Any], fmt: str, where: str) -> None:
    if obj.get("format") != fmt or obj.get("version") != FORMAT_VERSION:
        raise VectorFormatError(
            f"{where}: format {obj.get('format')!r} version {obj.get('version')!r}; "
            f"this reader takes {fmt!r} version {FORMAT_VERSION}"
        )
