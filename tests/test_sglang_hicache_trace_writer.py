"""The SGLang HiCache trace writer (hicache/testing/adapters/sglang_hicache_trace.py) on
hand-made tree snapshots: what it emits for one engine call, without sglang installed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hicache.testing.adapters.sglang_hicache_trace import Held, SGLangHiCacheTrace


def _node(nid: int, parent: Any = None) -> Any:
    node = SimpleNamespace(id=nid, parent=parent, children={})
    if parent is not None:
        parent.children[nid] = node
    return node


def test_a_split_upper_part_backed_up_in_the_same_call_is_issued() -> None:
    """sglang's insert splits node 2 (pages 0-8, in L1, its backup deferred: L2 was full) at
    4 and, in the same call, backs up the new upper part 3 and the request's new leaf 4
    under it. Before, the writer took a split's upper part to hold only what its lower part
    held, so the upper part's backup was never issued and the leaf's was refused as a
    backup gap (the traced fuzz, sglang seed 6)."""
    trace = SGLangHiCacheTrace(4, {"L1": 8, "L2": 8}, "test", full=None)
    root = _node(1)
    lower_before = _node(2, root)
    before = {2: Held(lower_before, (0, 8), (1, 2), None, None)}
    root2 = _node(1)
    upper = _node(3, root2)
    lower = _node(2, upper)
    leaf = _node(4, upper)
    after = {
        3: Held(upper, (0, 4), (1,), (5,), 11),
        2: Held(lower, (4, 8), (2,), None, None),
        4: Held(leaf, (4, 8), (3,), (6,), 11),
    }
    trace.changed(before, after)
    issued = [(e.event, e.node) for e in trace.base.events]
    assert issued == [("split", 2), ("d2h_issue", 3), ("d2h_issue", 4)]


def test_one_calls_backups_issue_and_end_parent_first_whatever_their_ids() -> None:
    """sglang merges one call's pending backups into one copy with one ack (start_writing):
    a split's lower part, queued first (the lower pending id), and its new upper part are
    issued -- and end -- together. The trace puts the parent's op first both times; before,
    it went by pending id, and check-trace refused the child's backup under a parent that
    was neither in L2 nor being written (the traced fuzz, sglang seed 6)."""
    trace = SGLangHiCacheTrace(4, {"L1": 8, "L2": 8}, "test", full=None)
    root = _node(1)
    upper = _node(3, root)
    lower = _node(2, upper)
    before = {
        3: Held(upper, (0, 8), (1, 2), None, None),
        2: Held(lower, (8, 12), (3,), None, None),
    }
    after = {
        3: Held(upper, (0, 8), (1, 2), (5, 6), 12),
        2: Held(lower, (8, 12), (3,), (7,), 11),
    }
    trace._issued(before, after, load=False)
    trace.ended(set(), set(), after)
    events = [(e.event, e.node) for e in trace.base.events]
    assert events == [
        ("d2h_issue", 3),
        ("d2h_issue", 2),
        ("d2h_complete", 3),
        ("d2h_complete", 2),
    ]


def test_a_split_whose_lower_part_the_same_call_removed_is_still_a_split() -> None:
    """sglang's insert over a node L1 had evicted (its copy only in L2) splits it where the
    prompt leaves it, gives the upper part the prompt's device pages, and -- its backup of
    the new leaf needing host pages -- drops the lower part's host copy, which removes that
    host-only leaf in the same call. Before, the writer found no split (the lower part was
    no child of the new node: it was gone), wrote the upper part as a new node's `insert`
    and the whole old node's L2 copy as evicted; check-trace refused the insert where the
    reference splits (the traced fuzz, sglang seed 6: results finding 13)."""
    trace = SGLangHiCacheTrace(4, {"L1": 8, "L2": 5}, "test", full=None)
    old = _node(2, _node(1))
    prompt_old = tuple(range(20))
    before = {2: Held(old, (0, 20), None, (3, 4, 0, 1, 2), None, prompt_old, None)}
    upper = _node(3, _node(1))
    leaf = _node(4, upper)
    after = {
        3: Held(upper, (0, 8), (1, 2), (3, 4), None, prompt_old[:8], None),
        4: Held(leaf, (8, 20), (3, 4, 8), (0, 1, 2), 11, (90, 91, 92, 93) * 3, 3),
    }
    trace.changed(before, after)
    events = [(e.event, e.node, e.token_start, e.token_end, e.pages) for e in trace.base.events]
    assert events == [
        ("split", 2, None, None, ()),
        ("evict_l2", 2, 8, 20, (0, 1, 2)),
        ("d2h_issue", 4, 8, 20, (0, 1, 2)),
    ]
    assert trace.base.events[0].detail == {"at": 8, "upper": 3}
