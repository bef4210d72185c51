"""`hicache vectors generate DIR`: write the conformance vectors hicache's controller defines.

    hicache vectors generate DIR [--count N] [--seed S] [--category NAME ...]

For each category (hicache/oracle/vectors/categories.py) and each i < N, the case
`<category>-<i>.json` is the category's script drawn from `random.Random("S:category:i")`,
run through the controller adapter (hicache/oracle/vectors/adapters.py: `controller`), with every
observation recorded; then `manifest.json` lists every case with its sha256. The same
arguments write the same bytes. DIR must be new or empty (a stale case left beside the new
ones would fail `run`). Exit status: 0 written, 2 a usage error (one line on stderr).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hicache.app.outputs import OUTPUT_DIR
from hicache.app.usage import UsageParser
from hicache.oracle.vectors.adapters import controller
from hicache.oracle.vectors.categories import CATEGORIES
from hicache.oracle.vectors.drive import Driver
from hicache.oracle.vectors.format import (
    MANIFEST,
    ManifestEntry,
    case_json,
    manifest_json,
    sha256_hex,
)
from hicache.oracle.vectors.recorder import Recorder

DEFAULT_COUNT = 2
"""Cases per category by default: 24 categories x 2 = 48 cases, generated and run in a few
seconds (tests/test_vectors.py does both)."""
DEFAULT_SEED = 0


VectorsParser = UsageParser  # `hicache vectors run` builds its parser from this name


def generate_case(category: str, seed: int, index: int) -> tuple[str, bytes]:
    """One case: its file name and canonical bytes."""
    rng = random.Random(f"{seed}:{category}:{index}")
    config, script = CATEGORIES[category](rng)
    cache = controller(config)
    try:
        driver = Driver(cache, config)
        recorder = Recorder(driver, rng)
        script(recorder)
        final = driver.final()
    finally:
        cache.close()
    # Verify an L1-only case stayed in L1: no transfer was ever in flight (else it would not
    # be what a one-tier cache does).
    assert config.tiers != ("L1",) or not any(s["expect"]["pending_ops"] for s in recorder.steps), (
        f"{category}: an L1-only script issued a transfer"
    )
    name = f"{category}-{index:03d}"
    return f"{name}.json", case_json(name, category, seed, config, recorder.steps, final)


def generate(
    directory: Path, count: int, seed: int, categories: Sequence[str]
) -> list[ManifestEntry]:
    """Write `count` cases of each of `categories` and the manifest into `directory` (new or
    empty); returns the manifest's entries."""
    directory.mkdir(parents=True, exist_ok=True)
    entries = []
    for category in categories:
        for i in range(count):
            file, data = generate_case(category, seed, i)
            (directory / file).write_bytes(data)
            entries.append(ManifestEntry(file, category, sha256_hex(data)))
    picked = "" if list(categories) == list(CATEGORIES) else " --category " + " ".join(categories)
    command = f"hicache vectors generate DIR --count {count} --seed {seed}{picked}"
    (directory / MANIFEST).write_bytes(manifest_json(entries, command))
    return entries


def main(argv: Sequence[str] | None = None) -> int:
    # DIR first in the usage line: --category takes every name after it, so a DIR written
    # after the names would be read as one more (argparse's own usage put DIR last).
    parser = VectorsParser(
        prog="hicache vectors generate",
        description=__doc__.split("\n")[0],
        usage="%(prog)s DIR [--count N] [--seed S] [--category NAME [NAME ...]]",
    )
    parser.add_argument(
        "dir", type=OUTPUT_DIR, metavar="DIR", help="a new or empty directory (made if missing)"
    )
    parser.add_argument(
        "--count",
        type=int,
        default=DEFAULT_COUNT,
        help=f"cases per category (default {DEFAULT_COUNT})",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"(default {DEFAULT_SEED})")
    parser.add_argument(
        "--category",
        nargs="+",
        choices=sorted(CATEGORIES),
        default=list(CATEGORIES),
        metavar="NAME",
        help="only these categories (default: all)",
    )
    args = parser.parse_args(argv)
    args.dir = Path(args.dir)
    if args.count < 1:
        parser.error(f"--count: at least 1, got {args.count}")
    if args.dir.exists() and (not args.dir.is_dir() or any(args.dir.iterdir())):
        parser.error(
            f"DIR {args.dir} exists and is not an empty directory; pass a new or empty one"
        )
    try:
        args.dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"DIR {args.dir}: cannot create it ({exc.strerror}); pass a writable path")
    started = time.perf_counter()
    entries = generate(args.dir, args.count, args.seed, args.category)
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.category] = counts.get(e.category, 0) + 1
    print(
        f"wrote {len(entries)} cases in {len(counts)} categories to {args.dir} "
        f"({time.perf_counter() - started:.2f} s)",
        file=sys.stdout,
    )
    return 0
