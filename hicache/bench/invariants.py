"""How long the invariant checks take, and that the cost grows linearly in pages.

    hicache bench invariants [--pages 1000 10000 100000] [--repeats 7] [--out PATH]

For each size, a synthetic valid snapshot with that many pages per tier (three tiers, nodes
of 16 pages in a 4-ary tree, a few H2D and H2S ops in flight, one request with private
pages, digests on) is checked by every check; the table shows the median time of each check
in µs and of `check_all` in µs and in ns per page (pages of all tiers together), as wall time
and as this process's CPU time (steadier on a shared machine). A constant ns/page across
sizes is what linear means. `--out` also writes the numbers as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hicache.app.outputs import OUTPUT_FILE
from hicache.bench import BenchParser
from hicache.core.pages import FREE, PRIVATE, TREE, Pages
from hicache.core.snapshot import NodeView, OpView, RequestView, Snapshot, TierView
from hicache.errors import ConfigError, InvariantViolation
from hicache.invariants.registry import CHECKS, check_all

TIERS = ("L1", "L2", "L3")
ARITY = 4  # children per node of the synthetic tree
SIZES_DEFAULT = (1_000, 10_000, 100_000)
NODE_PAGES = 16  # pages per node of the synthetic tree
TREE_SHARE = 0.75  # of each tier's pages held by tree nodes; the rest: ops, a request, free


def min_pages_per_tier(node_pages: int = NODE_PAGES) -> int:
    """The fewest pages per tier a synthetic snapshot can be built with: its tree needs at
    least ARITY nodes of `node_pages` pages within TREE_SHARE (3/4) of each tier."""
    least = -(-ARITY * node_pages * 4 // 3)  # ceil(ARITY * node_pages / TREE_SHARE)
    # Verify the closed form against the rule synthetic_snapshot applies.
    nodes = [int(TREE_SHARE * pages) // node_pages for pages in (least - 1, least)]
    assert nodes[0] < ARITY <= nodes[1], f"minimum {least} for {node_pages}-page nodes is off"
    return least


def too_few_pages(pages_per_tier: int, node_pages: int = NODE_PAGES) -> str:
    """Why `pages_per_tier` is too few, the rule and the exact minimum first."""
    return (
        f"{pages_per_tier} pages per tier is too few: the synthetic tree needs at least "
        f"{ARITY} nodes of {node_pages} pages within 3/4 of each tier (the rest holds "
        f"in-flight transfers and a request's pages), so at least "
        f"{min_pages_per_tier(node_pages)} pages per tier"
    )


def synthetic_snapshot(
    pages_per_tier: int,
    *,
    seed: int = 0,
    node_pages: int = NODE_PAGES,
    n_ops: int = 3,
    page_size: int = 16,
) -> Snapshot:
    """A valid snapshot: `N = 0.75 * pages_per_tier / node_pages` nodes, all RESIDENT in L2, the
    first N/3 in L1 and N/2 in L3; `n_ops` H2D ops (one node each) restore the next nodes into
    L1 and `n_ops` H2S ops back up the next ones to L3; one request holds `node_pages` private
    L1 pages. Physical pages are a random permutation per tier (`seed`)."""
    n_nodes = int(TREE_SHARE * pages_per_tier) // node_pages
    if n_nodes < ARITY:
        raise ConfigError("pages_per_tier", too_few_pages(pages_per_tier, node_pages))
    rng = np.random.default_rng(seed)
    perm = {t: rng.permutation(pages_per_tier).astype(np.int64) for t in TIERS}
    in_l1, in_l3 = n_nodes // 3, n_nodes // 2
    h2d = list(range(in_l1 + 1, in_l1 + 1 + min(n_ops, n_nodes - in_l1)))
    h2s = list(range(in_l3 + 1, in_l3 + 1 + min(n_ops, n_nodes - in_l3)))
    resident = {"L1": range(1, in_l1 + 1), "L2": range(1, n_nodes + 1), "L3": range(1, in_l3 + 1)}

    def chunk(tier: str, slot: int) -> Pages:
        return perm[tier][slot * node_pages : (slot + 1) * node_pages]

    values = {t: {i: chunk(t, k) for k, i in enumerate(resident[t])} for t in TIERS}
    key_tokens = node_pages * page_size
    ops = [
        _op(100 + k, "H2D", "L2", "L1", i, values["L2"][i], chunk("L1", in_l1 + k), key_tokens)
        for k, i in enumerate(h2d)
    ]
    ops += [
        _op(200 + k, "H2S", "L2", "L3", i, values["L2"][i], chunk("L3", in_l3 + k), key_tokens)
        for k, i in enumerate(h2s)
    ]
    held = chunk("L1", in_l1 + len(h2d))
    # The request holds node 1 (a child of the root, RESIDENT in L1) locked in L1.
    request = RequestView(1, key_tokens, locked_node_id=1, private_pages={"L1": held})
    nodes = _nodes(n_nodes, values, ops, key_tokens, [("L1", 1)])
    owner = {t: np.full(pages_per_tier, FREE, dtype=np.uint8) for t in TIERS}
    for t in TIERS:
        for v in values[t].values():
            owner[t][v] = TREE
    for op in ops:
        owner[op.target][op.target_pages] = PRIVATE
    owner["L1"][held] = PRIVATE
    tiers = {t: TierView(t, pages_per_tier, owner[t], len(values[t]) * node_pages) for t in TIERS}
    return Snapshot(page_size, tiers, tuple(nodes), tuple(ops), (request,), _digests(values), 0)


def _op(
    op_id: int,
    direction: str,
    source: str,
    target: str,
    node_id: int,
    src: Pages,
    dst: Pages,
    key_tokens: int,
) -> OpView:
    # Token ranges are only checked for alignment and length, so each op claims its node's
    # length from token 0 (the real start would be the node's depth times key_tokens).
    return OpView(
        op_id, direction, source, target, (node_id,), src, dst, 0, key_tokens, lock_node_id=node_id
    )


def _nodes(
    n_nodes: int,
    values: dict[str, dict[int, Pages]],
    ops: list[OpView],
    key_tokens: int,
    request_locks: list[tuple[str, int]],
) -> list[NodeView]:
    """Root 0 and nodes 1..n_nodes; node i's parent is (i - 1) // ARITY (so the root has ARITY
    children and any prefix 1..k of node ids is closed under parents). Lock counts are path
    locks: each op's source lock and each (tier, node) of `request_locks` count on the node and
    every ancestor below the root."""
    children: dict[int, list[int]] = {}
    for i in range(1, n_nodes + 1):
        children.setdefault((i - 1) // ARITY, []).append(i)
    pending = {(op.target, op.node_ids[0]): op for op in ops}
    locks: dict[tuple[str, int], int] = {}
    for tier, held in [(op.source, op.node_ids[0]) for op in ops] + request_locks:
        while held != 0:
            locks[(tier, held)] = locks.get((tier, held), 0) + 1
            held = (held - 1) // ARITY
    out = [
        NodeView(
            0,
            None,
            tuple(children.get(0, ())),
            0,
            dict.fromkeys(TIERS),
            dict.fromkeys(TIERS, "ABSENT"),
            dict.fromkeys(TIERS, 0),
            dict.fromkeys(TIERS),
        )
    ]
    for i in range(1, n_nodes + 1):
        vals = {t: values[t].get(i) for t in TIERS}
        states = {t: "RESIDENT" if vals[t] is not None else "ABSENT" for t in TIERS}
        waiting = {t: pending.get((t, i)) for t in TIERS}
        for t, filling in waiting.items():
            if filling is not None:
                states[t] = f"{filling.direction}_PENDING"
        out.append(
            NodeView(
                i,
                (i - 1) // ARITY,
                tuple(children.get(i, ())),
                key_tokens,
                vals,
                states,
                {t: locks.get((t, i), 0) for t in TIERS},
                {t: None if filling is None else filling.op_id for t, filling in waiting.items()},
            )
        )
    return out


def _digests(values: dict[str, dict[int, Pages]]) -> Callable[[str, Pages], npt.NDArray[np.uint64]]:
    """Content per physical page: logical page k of node i holds i * 2**20 + k in every tier."""
    content: dict[str, npt.NDArray[np.uint64]] = {}
    for t, per_node in values.items():
        size = max((int(v.max()) + 1 for v in per_node.values()), default=0)
        table = np.zeros(size, dtype=np.uint64)
        for i, v in per_node.items():
            table[v] = np.uint64(i << 20) + np.arange(v.size, dtype=np.uint64)
        content[t] = table

    def digests(tier: str, p: Pages) -> npt.NDArray[np.uint64]:
        return content[tier][p]

    return digests


def _median_us(fn: Callable[[Snapshot], object], s: Snapshot, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median CPU (this process) time of `fn(s)`, in µs, each run on a
    fresh copy of `s`: the checks keep what they derive in `Snapshot.memo`, which a repeat on
    the same object would find filled. On a shared machine the CPU time is the steadier
    figure: it leaves out time spent descheduled."""
    wall, cpu = [], []
    for _ in range(repeats):
        fresh = dataclasses.replace(s)
        t0, c0 = time.perf_counter_ns(), time.process_time_ns()
        fn(fresh)
        wall.append(time.perf_counter_ns() - t0)
        cpu.append(time.process_time_ns() - c0)
    return statistics.median(wall) / 1e3, statistics.median(cpu) / 1e3


def bench_invariants(pages_per_tier: list[int], repeats: int = 7) -> dict[str, Any]:
    """Median time of every check and of `check_all` on one synthetic snapshot per size.
    Raises if a synthetic snapshot is not valid (the benchmark must time the passing path)."""
    rows = []
    for n in pages_per_tier:
        s = synthetic_snapshot(n)
        found = check_all(s)
        # Verify the snapshot is valid: a failing check may take a different (shorter) path.
        if found:
            raise InvariantViolation(tuple(found), f"building a synthetic snapshot of {n} pages")
        per_check = {c.id: _median_us(c.func, s, repeats)[0] for c in CHECKS}
        total_us, total_cpu_us = _median_us(check_all, s, repeats)
        total_pages = n * len(TIERS)
        rows.append(
            {
                "pages_per_tier": n,
                "pages_total": total_pages,
                "nodes": len(s.nodes),
                "ops": len(s.ops),
                "checks_us": per_check,
                "check_all_us": total_us,
                "ns_per_page": total_us * 1e3 / total_pages,
                "check_all_cpu_us": total_cpu_us,
                "cpu_ns_per_page": total_cpu_us * 1e3 / total_pages,
            }
        )
    return {
        "benchmark": "invariants",
        "repeats": repeats,
        "rows": rows,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


def format_table(result: dict[str, Any]) -> str:
    """The result as a text table: one row per size, one column per check (µs)."""
    ids = [c.id for c in CHECKS]
    head = [
        "pages/tier",
        "nodes",
        *(f"{i} µs" for i in ids),
        "all µs",
        "ns/page",
        "cpu µs",
        "cpu ns/page",
    ]
    legend = (
        f"legend: median of {result['repeats']} runs, wall clock; {ids[0]}..{ids[-1]}: "
        "each check (`hicache invariants` names them); all: check_all, every check once; "
        "ns/page: all per page of the three tiers; cpu: this process's CPU time"
    )
    lines = [legend, " ".join(f"{h:>11}" for h in head)]
    for r in result["rows"]:
        cells = [
            str(r["pages_per_tier"]),
            str(r["nodes"]),
            *(f"{r['checks_us'][i]:.0f}" for i in ids),
            f"{r['check_all_us']:.0f}",
            f"{r['ns_per_page']:.1f}",
            f"{r['check_all_cpu_us']:.0f}",
            f"{r['cpu_ns_per_page']:.1f}",
        ]
        lines.append(" ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = BenchParser("invariants", "Time the invariant checks on synthetic snapshots.")
    parser.add_argument(
        "--pages",
        type=int,
        nargs="+",
        default=list(SIZES_DEFAULT),
        help="pages per tier, one snapshot each",
    )
    parser.add_argument(
        "--repeats", type=int, default=7, help="timed runs per measurement (the median is reported)"
    )
    parser.add_argument(
        "--out", type=OUTPUT_FILE, help="also write the numbers as JSON to this path"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    for n in args.pages:
        if n < min_pages_per_tier():
            parser.error(f"--pages: {too_few_pages(n)}")
    result = bench_invariants(args.pages, args.repeats)
    print(format_table(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
