"""How long the control plane's tree walks take on the CPU: HiRadixTree match and insert.

    hicache bench control [--tokens 350 3500 35000] [--background 100]
                          [--repeats 21] [--page-size 16] [--seed 0] [--out PATH]

The tree first holds `--background` random prefixes (64..4,096 tokens each; a quarter of them
continue one of 8 shared 256-token "system prompts", so the root has siblings and inner
nodes, as a serving tree does). Then, per size N (aligned down to the page size):

    match hit    `match` of an N-token prefix the tree holds in L1 (one node, no split)
    match miss   `match` of N random tokens (the walk stops at the root's children)
    insert       what the control plane does for a new prefix that shares its first half
                 with a held one: `match` (splits on the first repeat, then walks the upper
                 half), `add_child` for the second half, `set_value` publishing it in L1

Times are medians over `--repeats` runs, in µs, as wall time and as this process's CPU time
(steadier on a shared machine). Token lists are built before the clock starts: the cost of
turning them into the tree's tuples is part of the measurement, making them is not.
`--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hicache.app.outputs import OUTPUT_FILE
from hicache.bench import BenchParser
from hicache.core.lifecycle import RESIDENT
from hicache.core.tree import HiRadixTree, TreeNode

SIZES_DEFAULT = (350, 3_500, 35_000)
VOCAB = 151_936  # Qwen3's vocabulary: token ids are drawn from it uniformly
STEM_TOKENS = 256  # length of each shared "system prompt"
STEMS = 8


class _Publisher:
    """Hands out fresh physical page numbers per tier, as an allocator would."""

    def __init__(self) -> None:
        self.next = [0, 0, 0]

    def insert(self, tree: HiRadixTree, tokens: list[int], tier: int = 0) -> TreeNode:
        """Insert `tokens` (page aligned) into `tier` the way the control plane does: match,
        add a child for the unmatched rest, publish every path node the tier lacks (parent
        first). Returns the deepest node."""
        m = tree.match(tokens)
        path = list(m.path)
        if m.matched_len < len(tokens):
            path.append(tree.add_child(path[-1] if path else tree.root, tokens[m.matched_len :]))
        for node in path:
            if node.state[tier] != RESIDENT:
                start = self.next[tier]
                self.next[tier] += node.num_pages
                tree.set_value(
                    node, tier, np.arange(start, self.next[tier], dtype=np.int64), RESIDENT
                )
        return path[-1]


def background_tree(
    page_size: int, n_prefixes: int, rng: np.random.Generator
) -> tuple[HiRadixTree, _Publisher]:
    """A tree holding `n_prefixes` random prefixes in L1 (see the module docstring)."""
    tree, pub = HiRadixTree(page_size), _Publisher()
    stems = [_tokens(rng, STEM_TOKENS) for _ in range(STEMS)]
    for i in range(n_prefixes):
        n = int(rng.integers(64, 4_097))
        head = stems[i % STEMS] if i % 4 == 0 else []
        tokens = head + _tokens(rng, n)
        pub.insert(tree, tokens[: len(tokens) - len(tokens) % page_size])
    return tree, pub


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return [int(t) for t in rng.integers(0, VOCAB, n).tolist()]


def _median_us(
    fn: Callable[[], object], repeats: int, setup: Callable[[], None] | None = None
) -> tuple[float, float]:
    """Median wall-clock and median CPU time of `fn()`, in µs; `setup()` runs untimed before
    each call. The garbage collector is paused while the clock runs (its pauses belong to
    whichever call happens to trigger them, not to the one being measured)."""
    wall, cpu = [], []
    for _ in range(repeats):
        if setup is not None:
            setup()
        gc.disable()
        try:
            t0, c0 = time.perf_counter_ns(), time.process_time_ns()
            fn()
            wall.append(time.perf_counter_ns() - t0)
            cpu.append(time.process_time_ns() - c0)
        finally:
            gc.enable()
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3


def _bench_size(
    tree: HiRadixTree, pub: _Publisher, n: int, repeats: int, rng: np.random.Generator
) -> dict[str, Any]:
    """One row: match hit, match miss and insert for prefixes of `n` tokens (page aligned)."""
    ps = tree.page_size
    aligned = n - n % ps
    held = _tokens(rng, aligned)
    pub.insert(tree, held)
    # Verify the hit case really hits all of it (else we would time a shorter walk).
    if tree.match(held, touch=False).lengths[0] != aligned:
        raise AssertionError(f"the {aligned}-token prefix just inserted does not match in full")
    miss = _tokens(rng, aligned)
    hit_us, hit_cpu = _median_us(lambda: tree.match(held), repeats)
    miss_us, miss_cpu = _median_us(lambda: tree.match(miss), repeats)
    half = (aligned // 2) - (aligned // 2) % ps
    fresh: list[list[int]] = []

    def make() -> None:
        fresh.append(held[:half] + _tokens(rng, aligned - half))

    insert_us, insert_cpu = _median_us(lambda: pub.insert(tree, fresh[-1]), repeats, make)
    return {
        "tokens": n,
        "aligned_tokens": aligned,
        "pages": aligned // ps,
        "match_hit_us": hit_us,
        "match_hit_cpu_us": hit_cpu,
        "match_miss_us": miss_us,
        "match_miss_cpu_us": miss_cpu,
        "insert_us": insert_us,
        "insert_cpu_us": insert_cpu,
        "insert_new_tokens": aligned - half,
    }


def bench_tree(
    sizes: Sequence[int] = SIZES_DEFAULT,
    *,
    page_size: int = 16,
    background: int = 100,
    repeats: int = 21,
    seed: int = 0,
) -> dict[str, Any]:
    """Time match and insert for each prefix size in `sizes` (tokens) on one tree that holds
    `background` other prefixes. Returns the table as a JSON-ready dict."""
    rng = np.random.default_rng(seed)
    tree, pub = background_tree(page_size, background, rng)
    nodes_before = len(tree)
    rows = [_bench_size(tree, pub, n, repeats, rng) for n in sizes]
    # Verify the tree the timings walked is internally consistent.
    problems = tree.audit()
    if problems:
        raise AssertionError(f"tree inconsistent after the benchmark: {problems[:3]}")
    return {
        "benchmark": "control.tree",
        "page_size": page_size,
        "background_prefixes": background,
        "background_nodes": nodes_before,
        "nodes_after": len(tree),
        "repeats": repeats,
        "seed": seed,
        "rows": rows,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def format_table(result: dict[str, Any]) -> str:
    """The tree result as a text table, one row per size (µs; CPU time in brackets)."""
    lines = [
        f"HiRadixTree, page_size {result['page_size']}, {result['background_prefixes']} "
        f"background prefixes ({result['background_nodes']} nodes); median of "
        f"{result['repeats']} runs",
        "legend: µs = microseconds per call, wall clock (this process's CPU time); match "
        "hit / miss: a held / random prefix; insert: match, add the new half, publish it",
    ]
    head = ("tokens", "pages", "match hit µs", "match miss µs", "insert µs")
    lines.append(f"{head[0]:>8} {head[1]:>6} {head[2]:>18} {head[3]:>18} {head[4]:>18}")
    for r in result["rows"]:
        cells = [
            f"{r[k]:.1f} ({r[k.replace('_us', '_cpu_us')]:.1f})"
            for k in ("match_hit_us", "match_miss_us", "insert_us")
        ]
        lines.append(
            f"{r['tokens']:>8} {r['pages']:>6} {cells[0]:>18} {cells[1]:>18} {cells[2]:>18}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = BenchParser("control", "Time HiRadixTree match and insert on the CPU.")
    parser.add_argument(
        "--tokens",
        type=int,
        nargs="+",
        default=list(SIZES_DEFAULT),
        help="prefix lengths in tokens, one row each (aligned down to the page size)",
    )
    parser.add_argument("--background", type=int, default=100, help="other prefixes the tree holds")
    parser.add_argument(
        "--repeats",
        type=int,
        default=21,
        help="timed runs per measurement (the median is reported)",
    )
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random token ids")
    parser.add_argument(
        "--out", type=OUTPUT_FILE, help="also write the numbers as JSON to this path"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.page_size < 1:
        parser.error("--page-size must be at least 1")
    if args.background < 0:
        parser.error("--background must be 0 or more")
    if any(n < 2 * args.page_size for n in args.tokens):
        parser.error(
            f"--tokens: each size must be at least two pages ({2 * args.page_size} tokens)"
        )
    result = bench_tree(
        args.tokens,
        page_size=args.page_size,
        background=args.background,
        repeats=args.repeats,
        seed=args.seed,
    )
    print(format_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
