"""`hicache vectors run DIR`: drive an adapter through every case in DIR and compare.

    hicache vectors run DIR [--adapter module:factory] [--quiet]

`factory(config)` builds a fresh `CacheUnderTest` per case: the one factory protocol of
hicache/testing/factory.py, the one `hicache fuzz --adapter` takes too (the built-in ones:
hicache/oracle/vectors/adapters.py; the default is hicache's controller). Every file the manifest
lists is read, its sha256 checked, and its steps run in order (R78); each step's observation is
compared with the recorded one as spec/vectors.md says (a refusal compares as refused or not,
its class is only shown). Output: a line per case (`PASS`, `FAIL` with the step, the
operation, the observation, expected and got; `SKIP` when the factory raised
`UnsupportedConfig`), a line per file in DIR the manifest does not list, then a summary with
cases per second.

Exit status: 0 every case passed or was skipped (at least one passed) and every file was
consumed; 1 a case failed, a listed file is missing, unreadable, malformed or has another
sha256, a file in DIR is not listed, or every case was skipped; 2 a usage error (no manifest, an
`--adapter` that is not a factory of that protocol, named by `AdapterError`): one line on stderr.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hicache.errors import HiCacheError
from hicache.oracle.vectors.drive import Driver, StepError
from hicache.oracle.vectors.format import (
    MANIFEST,
    Case,
    ManifestEntry,
    UnsupportedConfig,
    VectorFormatError,
    parse_case,
    read_manifest,
    sha256_hex,
)
from hicache.oracle.vectors.generate import VectorsParser
from hicache.testing.factory import AdapterError, build, load_factory
from hicache.testing.factory import Factory as Factory  # what a factory is (for callers)

DEFAULT_ADAPTER = "hicache.oracle.vectors.adapters:controller"


@dataclass(frozen=True)
class Verdict:
    """One case's (or one stray file's) outcome: PASS, FAIL or SKIP, and why."""

    name: str
    status: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.status} {self.name}" + (f": {self.detail}" if self.detail else "")


def run_dir(directory: Path, factory: Factory) -> list[Verdict]:
    """Every listed case run, and every unlisted file in `directory` reported (FAIL).
    VectorFormatError when the manifest itself is missing or malformed."""
    entries = read_manifest(directory)
    listed = {e.file for e in entries}
    verdicts = [
        Verdict(p.name, "FAIL", "in DIR but not in the manifest: not consumed")
        for p in sorted(directory.iterdir())
        if p.name != MANIFEST and p.name not in listed
    ]
    for entry in entries:
        verdicts.append(run_entry(directory, entry, factory))
    return verdicts


def run_entry(directory: Path, entry: ManifestEntry, factory: Factory) -> Verdict:
    path = directory / entry.file
    try:
        data = path.read_bytes()
    except OSError as e:
        return Verdict(entry.file, "FAIL", f"listed in the manifest but unreadable ({e.strerror})")
    if sha256_hex(data) != entry.sha256:
        return Verdict(
            entry.file,
            "FAIL",
            f"sha256 {sha256_hex(data)[:16]}... differs from the manifest's "
            f"{entry.sha256[:16]}...: the file changed after generation",
        )
    try:
        case = parse_case(data, entry.file)
    except VectorFormatError as e:
        return Verdict(entry.file, "FAIL", str(e))
    if case.category != entry.category:
        return Verdict(
            entry.file, "FAIL", f"category {case.category!r}, the manifest says {entry.category!r}"
        )
    return run_case(case, factory, entry.file)


def run_case(case: Case, factory: Factory, name: str) -> Verdict:
    """Build the engine, run every step, compare each observation and the final snapshot
    (the verdict is reported under `name`, the case's file)."""
    try:
        cache = factory(case.config)
    except UnsupportedConfig as e:
        return Verdict(name, "SKIP", str(e))
    except AdapterError:
        raise  # not a factory of the protocol: a usage error, not this case's failure
    except HiCacheError as e:
        return Verdict(name, "FAIL", f"the adapter could not be built: {e}")
    try:
        if cache.page_size != case.config.page_size or not set(case.config.tiers) <= set(
            cache.tiers
        ):
            return Verdict(
                name,
                "FAIL",
                f"the adapter built page size {cache.page_size}, tiers "
                f"{list(cache.tiers)}; the case needs {case.config.page_size}, "
                f"{list(case.config.tiers)}",
            )
        return _run_steps(case, Driver(cache, case.config), name)
    finally:
        cache.close()


def _run_steps(case: Case, driver: Driver, name: str) -> Verdict:
    for i, step in enumerate(case.steps):
        op = {k: v for k, v in step.items() if k != "expect"}
        where = f"step {i} ({describe(op)})"
        try:
            got = _plain(driver.step(op))
        except StepError as e:
            return Verdict(name, "FAIL", f"{where}: {e}")
        except Exception as e:  # a foreign adapter's crash fails this case; the others still run
            return Verdict(name, "FAIL", f"{where}: the adapter raised {type(e).__name__}: {e}")
        diff = compare_step(step["expect"], got)
        if diff is not None:
            return Verdict(name, "FAIL", f"{where}: {diff}")
    diff = first_difference(case.final, _plain(driver.final()), "final")
    if diff is not None:
        return Verdict(name, "FAIL", f"after step {len(case.steps) - 1}: {diff}")
    return Verdict(name, "PASS")


def compare_step(expected: dict[str, Any], got: dict[str, Any]) -> str | None:
    """The first observation that differs, described, or None. `refused` compares as refused
    or not (the class name is the engine's own); `result` is not compared when refused."""
    if (expected["refused"] is None) != (got["refused"] is None):
        want = f"refused ({expected['refused']})" if expected["refused"] else "accepted"
        have = f"refused ({got['refused']})" if got["refused"] else "accepted"
        return f"refused: expected {want}, got {have}"
    for key in ("result", "crashed", "live", "cached_len", "pending_ops", "changes"):
        if key == "result" and expected["refused"] is not None:
            continue
        diff = first_difference(expected[key], got[key], key)
        if diff is not None:
            return diff
    return None


def first_difference(expected: object, got: object, path: str) -> str | None:
    """`path: expected X, got Y` for the first differing value (objects compared key by key,
    so the message names the tier or field; of two long lists only the elements one lacks
    are named), or None when equal."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            diff = first_difference(expected.get(key), got.get(key), f"{path}.{key}")
            if diff is not None:
                return diff
        return None
    if expected == got and isinstance(expected, bool) == isinstance(
        got, bool
    ):  # JSON: true is not 1
        return None
    if isinstance(expected, list) and isinstance(got, list) and max(len(expected), len(got)) > 2:
        want, have = [json.dumps(e) for e in expected], [json.dumps(g) for g in got]
        missing = [w for w in want if w not in have]
        extra = [h for h in have if h not in want]
        if missing or extra:  # a long list: name only the elements that differ
            return (
                f"{path}: {len(expected)} expected, {len(got)} got; expected but missing "
                f"[{', '.join(missing)}], got but not expected [{', '.join(extra)}]"
            )
    return f"{path}: expected {json.dumps(expected)}, got {json.dumps(got)}"


def describe(op: dict[str, Any]) -> str:
    args = [
        f"{k} {len(v)} tokens" if k == "tokens" else f"{k} {v}" for k, v in op.items() if k != "op"
    ]
    return " ".join([op["op"], *args]) if args else op["op"]


def _plain(obs: dict[str, Any]) -> dict[str, Any]:
    """What the observation reads as once written to JSON (tuples as lists, keys as strings)."""
    return json.loads(json.dumps(obs))  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    parser = VectorsParser(prog="hicache vectors run", description=__doc__.split("\n")[0])
    parser.add_argument(
        "dir", type=Path, metavar="DIR", help="a directory `hicache vectors generate` wrote"
    )
    parser.add_argument(
        "--adapter",
        default=DEFAULT_ADAPTER,
        metavar="MODULE:FACTORY",
        help=f"a factory EngineConfig -> CacheUnderTest, as `hicache fuzz --adapter` takes "
        f"(default {DEFAULT_ADAPTER})",
    )
    parser.add_argument("--quiet", action="store_true", help="print only failures and the summary")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        parser.error(f"DIR {args.dir} is not a directory")
    started = time.perf_counter()
    try:
        factory = load_factory(args.adapter)
        verdicts = run_dir(args.dir, lambda config: build(factory, config, args.adapter))
    except (VectorFormatError, AdapterError) as e:
        parser.error(str(e))
    seconds = time.perf_counter() - started
    for v in verdicts:
        if not args.quiet or v.status == "FAIL":
            print(v.line())
    counts = {s: sum(v.status == s for v in verdicts) for s in ("PASS", "FAIL", "SKIP")}
    print(
        f"vectors: {len(verdicts)} checked ({counts['PASS']} passed, {counts['FAIL']} failed, "
        f"{counts['SKIP']} skipped) in {seconds:.2f} s, {len(verdicts) / seconds:.0f} cases/s; "
        f"adapter {args.adapter}"
    )
    if not counts["PASS"] and not counts["FAIL"]:
        print("vectors: no case ran (every one skipped): the adapter was checked against nothing")
    return 1 if counts["FAIL"] or not counts["PASS"] else 0
