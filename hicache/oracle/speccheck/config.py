"""config.md's knob table against `CacheConfig` (hicache/controller/config.py).

what               checked
-----------------  ---------------------------------------------------------------------
knobs              the table's rows are CacheConfig's fields, in field order
default            each row's default is the field's (strings quoted, as Python writes
                   None, True, False and numbers)
legal values       probed on the reference, for the forms it can probe (the text before a
                   `;` is the form; the rest is a remark):
                     one of: a, b, c   the code's list (config.CHOICES) for that knob, in
                                       order; each value builds, a value not listed is
                                       refused
                     integer ≥ N       N builds; N - 1 is refused
                     True or False     both build; the string "yes" is refused
                   "refused" means ConfigError naming that knob.
"""

from __future__ import annotations

import dataclasses
import re

from hicache.oracle.speccheck.mdtables import parse_tables

HEADERS = ("knob", "default", "legal values", "meaning")
OUTSIDE = "not-a-legal-value"
"""What an enumerated knob is probed with, expecting a refusal."""


def check_config(config_md: str) -> list[str]:
    """One problem per knob the table and `CacheConfig` disagree on."""
    from hicache.controller.config import CacheConfig  # the controller's package: late

    tables = [t for t in parse_tables(config_md) if t.headers == HEADERS]
    if len(tables) != 1:
        return [f"config.md: needs exactly one table with columns {', '.join(HEADERS)}"]
    rows = {row["knob"]: (line, row) for line, row in tables[0].rows}
    fields = dataclasses.fields(CacheConfig)
    names = [f.name for f in fields]
    problems = [
        f"config.md: knob {name} is not a field of CacheConfig"
        for name in rows
        if name not in names
    ]
    problems += [f"config.md: CacheConfig.{name} has no row" for name in names if name not in rows]
    listed = [name for name in rows if name in names]
    if listed != [name for name in names if name in rows]:
        problems.append(f"config.md: knobs out of CacheConfig's field order: {listed}")
    for f in fields:
        if f.name not in rows:
            continue
        line, row = rows[f.name]
        shown = _default(f.default)
        if row["default"] != shown:
            problems.append(
                f"config.md line {line}: {f.name} default {row['default']!r}, CacheConfig's "
                f"is {shown!r}"
            )
        problems += [f"config.md line {line}: {f.name}: {why}" for why in _probe(f.name, row)]
    return problems


def _default(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _probe(knob: str, row: dict[str, str]) -> list[str]:
    """Why the reference does not take exactly the legal values the row states, if it states
    a form that can be probed."""
    form = row["legal values"].split(";")[0].strip()
    from hicache.controller.config import CHOICES

    choices = CHOICES.get(knob)
    if m := re.fullmatch(r"one of: (.+)", form):
        inside: list[object] = [v.strip() for v in m.group(1).split(",")]
        outside: list[object] = [OUTSIDE]
        if choices is not None and tuple(inside) != choices:
            return [
                f"one of {', '.join(map(str, inside))}; the code's list is {', '.join(choices)}"
            ]
    elif m := re.fullmatch(r"integer ≥ (-?\d+)", form):
        inside, outside = [int(m.group(1))], [int(m.group(1)) - 1]
    elif form == "True or False":
        inside, outside = [True, False], ["yes"]
    else:  # a remark only: not probed
        return [] if choices is None else [f"not `one of: {', '.join(choices)}`"]
    if choices is not None and not form.startswith("one of: "):
        return [f"not `one of: {', '.join(choices)}`"]
    problems = [f"{v!r} is legal but refused ({why})" for v in inside if (why := _refusal(knob, v))]
    problems += [f"{v!r} is not legal but accepted" for v in outside if not _refusal(knob, v)]
    return problems


def _refusal(knob: str, value: object) -> str | None:
    """Why CacheConfig refuses `knob = value` (the ConfigError's message), None if it builds.
    A ConfigError naming another knob is reported as such."""
    from hicache.controller.config import CacheConfig
    from hicache.errors import ConfigError

    try:
        CacheConfig(**{knob: value})  # type: ignore[arg-type]
    except ConfigError as e:
        return str(e) if e.field == knob else f"ConfigError on {e.field}, not {knob}: {e}"
    return None
