"""The spec's pages against each other and the code: the reading order, the bug classes, the
metric names.

    reading order   every page of spec/ is listed in README.md's numbered reading order, and
                    every page listed there exists
    bug classes     every id `Bnn` a page cites is defined by a `### Bnn` heading of
                    bugclasses.md
    metric names    every metric a page names in backticks (`family_total`, with an optional
                    `{label}` or `{label="value"}`) is one the reference exports, with that
                    label and value
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# A family's label names and the values exported for each (from Prometheus text).
Exported = Mapping[str, Mapping[str, frozenset[str]]]

LISTED = re.compile(r"^\d+\. \[([\w.-]+\.md)\]\(\1\)", re.M)
CITED_CLASS = re.compile(r"\bB(\d\d)\b")
DEFINED_CLASS = re.compile(r"^### B(\d\d)\b", re.M)
NAMED_METRIC = re.compile(r"`([a-z0-9_]+_total)(?:\{([a-z_]+)(?:=\"([^\"]*)\")?\})?`")
SAMPLE = re.compile(r'^hicache_([a-z0-9_]+)(?:\{([a-z_]+)="([^"]*)"\})? ', re.M)


def check_reading_order(pages: Mapping[str, str]) -> list[str]:
    """`pages` maps each spec/*.md file name to its text; README.md lists the others."""
    readme = pages.get("README.md")
    if readme is None:
        return ["README.md: missing, so the reading order cannot be checked"]
    listed = LISTED.findall(readme)
    problems = [
        f"README.md: reading order lists {name}, which does not exist"
        for name in listed
        if name not in pages
    ]
    problems += [
        f"{name}: not in README.md's reading order"
        for name in sorted(pages)
        if name != "README.md" and name not in listed
    ]
    return problems


def check_bug_classes(pages: Mapping[str, str]) -> list[str]:
    """Every `Bnn` cited anywhere in the pages has its section in bugclasses.md."""
    defined = set(DEFINED_CLASS.findall(pages.get("bugclasses.md", "")))
    problems = []
    for name, text in sorted(pages.items()):
        for number, line in enumerate(text.splitlines(), 1):
            missing = sorted(set(CITED_CLASS.findall(line)) - defined)
            problems += [
                f"{name} line {number}: cites B{n}, which bugclasses.md does not define"
                for n in missing
            ]
    return problems


def exported_metrics(prometheus_text: str) -> dict[str, dict[str, frozenset[str]]]:
    """The families, label names and label values of a Prometheus text export."""
    found: dict[str, dict[str, set[str]]] = {}
    for family, label, value in SAMPLE.findall(prometheus_text):
        labels = found.setdefault(family, {})
        if label:
            labels.setdefault(label, set()).add(value)
    return {f: {k: frozenset(v) for k, v in ls.items()} for f, ls in found.items()}


def check_metric_names(pages: Mapping[str, str], exported: Exported) -> list[str]:
    """Every metric named in backticks is exported, with the label and value it names."""
    problems = []
    for name, text in sorted(pages.items()):
        for number, line in enumerate(text.splitlines(), 1):
            for family, label, value in NAMED_METRIC.findall(line):
                where = f"{name} line {number}: `{family}`"
                if family not in exported:
                    problems.append(f"{where} is not a metric the reference exports")
                elif label and label not in exported[family]:
                    problems.append(f"{where} has no label {label!r}")
                elif value and value not in exported[family][label]:
                    known = ", ".join(sorted(exported[family][label]))
                    problems.append(f"{where} has no {label}={value!r} (it has {known})")
    return problems


def reference_metrics() -> Exported | str:
    """What a fresh `Metrics` exports, or one line saying why it could not be read."""
    try:
        from hicache.controller.metrics import Metrics
    except ImportError as e:
        return f"metrics: cannot import hicache.controller.metrics ({e})"
    return exported_metrics(Metrics().to_prometheus())
