"""How often the group fuzz reaches the upstream scenarios of spec/pools.md that depend on
windows and partial reads (F11-F14, F23), counted by wrapping the controller's own calls.

    PYTHONPATH=. python3 benchmarks/scenario_counts.py [--pools dsv4-tiny] [--seeds 0 1 2 3 4]
        [--steps 2000]

Counted, per run of `hicache fuzz --pools P --seed S --steps N` (the null plane):

    tombstone        windows freed (`ControlPlane.tombstone`); `internal`: of a node with
                     children (SGLang's write-back frees internal nodes' SWA first, #29204)
    revive           freed windows given back by a request's recomputed copy
    F14 clipped      L1 hits a freed window ended before the anchor's run (`L1Windows.clip`
                     returned fewer pages than the run holds)
    F23 past a gap   L1 hits that end past a freed window, a whole window before the end
    F11 sidecar      partly landed S2H reports whose clamp is set by an ALL_PAGES sidecar
                     below the anchor
    F12 missing      reports that leave a clamping pool out (it counts none)
    F13 window       reports whose trailing or state pool landed less than the clamp, which
                     then publishes only what the window covers
    nodes kept       whole nodes those reports published (the rest released)

Prints one JSON line per seed and one with the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import hicache.controller.controller as controller_module
from hicache.controller.clamp import clamped_nodes
from hicache.core.control import ControlPlane
from hicache.core.treenode import TreeNode
from hicache.pools.hits import prefetch_clamp
from hicache.pools.presets import group as preset_group
from hicache.pools.spec import ALL_PAGES, PoolGroup
from hicache.pools.windows import L1Windows
from hicache.testing.runner import run


@contextlib.contextmanager
def counting(counts: Counter[str]) -> Iterator[None]:
    """Wrap the calls the scenarios pass through; restore them on exit."""
    tombstone, clip, clamped = ControlPlane.tombstone, L1Windows.clip, clamped_nodes
    revive = ControlPlane._revive

    def counted_tombstone(self: ControlPlane, node: TreeNode) -> Any:
        out = tombstone(self, node)
        counts["tombstone"] += 1
        counts["tombstone internal"] += bool(node.children)
        return out

    def counted_revive(self: ControlPlane, step: Any, request_id: int) -> None:
        node = step.segments[0].node
        before = node is not None and step.transition.name == "discard" and self.windows.freed(node)
        revive(self, step, request_id)
        counts["revive"] += bool(before)

    def counted_clip(self: L1Windows, run_nodes: Sequence[TreeNode]) -> int:
        pages = clip(self, run_nodes)
        held = sum(len(n.key) for n in run_nodes) // self.page_size
        if pages < held:
            counts["F14 clipped"] += 1
        ends, gap = 0, False
        for n in run_nodes:
            if ends >= pages:
                break
            gap = gap or self.freed(n)
            ends += len(n.key) // self.page_size
        counts["F23 past a gap"] += gap
        return pages

    def counted_clamped(
        group: PoolGroup, nodes: Sequence[TreeNode], landed: Mapping[str, int]
    ) -> int:
        keep = clamped(group, nodes, landed)
        _classify(group, nodes, landed, counts)
        counts["nodes kept"] += keep
        return keep

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(ControlPlane, "tombstone", counted_tombstone))
        stack.enter_context(mock.patch.object(ControlPlane, "_revive", counted_revive))
        stack.enter_context(mock.patch.object(L1Windows, "clip", counted_clip))
        stack.enter_context(mock.patch.object(controller_module, "clamped_nodes", counted_clamped))
        yield


def _classify(
    group: PoolGroup, nodes: Sequence[TreeNode], landed: Mapping[str, int], counts: Counter[str]
) -> None:
    reserved = sum(n.num_pages for n in nodes)
    kept = group.backed_up()
    anchor = group.anchor.name
    clamping = [
        p
        for p in kept.pools
        if p.name == anchor or (p.hit_policy == ALL_PAGES and p.source == anchor)
    ]
    counts["reports"] += 1
    if any(p.name not in landed for p in clamping):
        counts["F12 missing"] += 1
    anchor_landed = landed.get(anchor, 0)
    if any(
        p.name != anchor and p.name in landed and landed[p.name] < anchor_landed for p in clamping
    ):
        counts["F11 sidecar"] += 1
    published = prefetch_clamp(group, landed, reserved).published
    if any(
        p not in clamping and landed.get(p.name, 0) // kept.ratio(p.name) < published
        for p in kept.pools
    ):
        counts["F13 window"] += 1


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", default="dsv4-tiny")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=2000)
    args = p.parse_args(argv)
    preset_group(args.pools)  # ConfigError for an unknown preset, before any run
    total: Counter[str] = Counter()
    for seed in args.seeds:
        counts: Counter[str] = Counter()
        fuzz = argparse.Namespace(
            seed=seed,
            steps=args.steps,
            plane="null",
            adapter=None,
            report=False,
            progress=False,
            mutant=None,
            pools=args.pools,
        )
        out = io.StringIO()
        with counting(counts):
            status = run(fuzz, out)
        print(
            json.dumps(
                {"pools": args.pools, "seed": seed, "steps": args.steps, "status": status, **counts}
            )
        )
        total.update(counts)
    print(
        json.dumps(
            {"pools": args.pools, "seeds": args.seeds, "steps": args.steps, "total": dict(total)}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
