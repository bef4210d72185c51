"""invariants.md against the invariants registry: one heading per check, naming its checker
and its test. The page's checks are the registry's CHECKS (over one plane's snapshot) and the
cross-rank RANK_CHECKS (over every rank's view)."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from typing import Protocol

REGISTRY_MODULE = "hicache.invariants.registry"
RANKS_MODULE = "hicache.invariants"  # its entry point RANK_CHECKS: I7, I8, I10, I11 (ranks.py)


class CheckInfo(Protocol):
    """What the drift check reads from one entry of the invariants registry's CHECKS."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def func(self) -> Callable[..., object]: ...


def registry_checks(with_ranks: bool = False) -> Sequence[CheckInfo] | str:
    """The registry's CHECKS (and, `with_ranks`, the cross-rank RANK_CHECKS after them: what
    invariants.md documents), or one line saying why they cannot be read."""
    lists = [(REGISTRY_MODULE, "CHECKS")] + ([(RANKS_MODULE, "RANK_CHECKS")] if with_ranks else [])
    found: list[CheckInfo] = []
    for name, attr in lists:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            return f"invariants.md: headings not checked: {name} cannot be imported ({e})"
        checks = getattr(module, attr, None)
        if not isinstance(checks, (list, tuple)):
            return f"invariants.md: headings not checked: {name}.{attr} is not a sequence"
        found += checks
    return found


_HEADING = re.compile(r"^#{2,4}\s+([IS]\d+)\s+`([a-z0-9_]+)`\s*$")


def check_invariant_headings(checks: Sequence[CheckInfo], markdown: str) -> list[str]:
    """One heading `<id> `<name>`` per registered check, no other such heading, and each
    section names the checker `check_<name>` and its test `test_<name>_violation`."""
    problems: list[str] = []
    sections: dict[str, tuple[str, int, str]] = {}  # id -> (name, line, section text)
    lines = markdown.split("\n")
    starts = [(i, _HEADING.match(line)) for i, line in enumerate(lines)]
    heads = [(i, m) for i, m in starts if m is not None]
    for j, (i, m) in enumerate(heads):
        end = heads[j + 1][0] if j + 1 < len(heads) else len(lines)
        if m.group(1) in sections:
            problems.append(f"invariants.md line {i + 1}: {m.group(1)} has a second heading")
        sections[m.group(1)] = (m.group(2), i + 1, "\n".join(lines[i:end]))
    registered = {c.id: c for c in checks}
    for cid, c in registered.items():
        if c.func.__name__ != f"check_{c.name}":
            problems.append(
                f"registry: {cid} `{c.name}` is checked by {c.func.__name__}, not check_{c.name}"
            )
        if cid not in sections:
            problems.append(f"invariants.md: no heading for {cid} `{c.name}` (registry)")
            continue
        name, line, text = sections[cid]
        if name != c.name:
            problems.append(
                f"invariants.md line {line}: heading {cid} `{name}`, registry names it `{c.name}`"
            )
            continue
        for needed in (f"check_{c.name}", f"test_{c.name}_violation"):
            if needed not in text:
                problems.append(
                    f"invariants.md line {line}: section {cid} does not name `{needed}`"
                )
    for cid in sorted(set(sections) - set(registered)):
        name, line, _ = sections[cid]
        problems.append(f"invariants.md line {line}: heading {cid} `{name}` is not in the registry")
    return problems
