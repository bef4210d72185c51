"""HiRadixTree examples: per-tier hits, splits, alignment, per-tier LRU leaves, removal, locks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hicache.bench.control import main as bench_main
from hicache.core.pages import pages
from hicache.core.tree import HiRadixTree, TreeNode
from hicache.errors import ConfigError, TreeError

L1, L2, L3 = 0, 1, 2


class Pager:
    """Distinct fake physical pages per tier, so a duplicated or lost page shows up."""

    def __init__(self) -> None:
        self.next = [0, 1000, 2000]

    def publish(self, tree: HiRadixTree, node: TreeNode, tier: int) -> None:
        start = self.next[tier]
        self.next[tier] += node.num_pages
        tree.set_value(node, tier, pages(range(start, start + node.num_pages)), "RESIDENT")


def chain(
    tree: HiRadixTree, pager: Pager, keys: list[list[int]], tiers: list[tuple[int, ...]]
) -> list[TreeNode]:
    """A parent-first chain of nodes under the root; node i is published in tiers[i]."""
    out, parent = [], tree.root
    for key, held in zip(keys, tiers):
        parent = tree.add_child(parent, key)
        for t in held:
            pager.publish(tree, parent, t)
        out.append(parent)
    return out


def snapshot(node: TreeNode) -> tuple[object, ...]:
    values = tuple(None if v is None else v.tolist() for v in node.value)
    return (
        node.key,
        values,
        list(node.state),
        list(node.lock),
        list(node.pending),
        list(node.last_access),
        node.parent,
        dict(node.children),
    )


def test_page_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="page_size"):
        HiRadixTree(0)


def test_tiers_hit_independently() -> None:
    tree, pager = HiRadixTree(2), Pager()
    a, b, c = chain(tree, pager, [[1, 2], [3, 4, 5, 6], [7, 8]], [(L1, L2, L3), (L2, L3), (L2,)])
    m = tree.match([1, 2, 3, 4, 5, 6, 7, 8, 9, 9])
    # L1 stops after `a`, L3 after `b`, L2 runs to the end of the match.
    assert m.lengths == (2, 8, 6)
    assert m.handles == (a, c, b)
    assert m.path == (a, b, c) and m.matched_len == 8
    # A hole in a tier ends that tier's run even if deeper nodes hold it.
    tree.set_value(b, L2, None, "ABSENT")
    assert tree.match([1, 2, 3, 4, 5, 6, 7, 8]).lengths == (2, 2, 6)


def test_miss_returns_root_handles() -> None:
    tree, pager = HiRadixTree(2), Pager()
    chain(tree, pager, [[1, 2]], [(L1,)])
    m = tree.match([5, 6, 7, 8])
    assert m.lengths == (0, 0, 0) and m.matched_len == 0 and m.path == ()
    assert all(h is tree.root for h in m.handles)


def test_lengths_are_page_aligned() -> None:
    tree, pager = HiRadixTree(4), Pager()
    (a,) = chain(tree, pager, [[1, 2, 3, 4, 5, 6, 7, 8]], [(L1, L2)])
    # 7 tokens align down to 4: the match ends inside `a`, which is split at one page.
    m = tree.match([1, 2, 3, 4, 5, 6, 7])
    assert m.lengths == (4, 4, 0) and m.matched_len == 4
    assert (
        len(m.path) == 1 and m.path[0].key == (1, 2, 3, 4) and m.path[0].children[(5, 6, 7, 8)] is a
    )
    # Fewer tokens than a page: nothing can match.
    assert tree.match([1, 2, 3]).matched_len == 0
    # A mismatch inside a page drops that whole page.
    m = tree.match([1, 2, 3, 4, 5, 6, 0, 8])
    assert m.lengths == (4, 4, 0) and m.matched_len == 4


def test_match_split_keeps_every_tier_consistent_and_fires_hooks() -> None:
    tree, pager = HiRadixTree(2), Pager()
    (a,) = chain(tree, pager, [[1, 2, 3, 4, 5, 6]], [(L1, L2)])
    tree.set_value(a, L3, None, "H2S_PENDING")
    tree.set_pending(a, L3, 7)
    tree.lock(a, L2)
    tree.lock(a, L2)
    ticks = list(a.last_access)
    seen: list[tuple[TreeNode, TreeNode]] = []
    tree.on_split.append(lambda upper, lower: seen.append((upper, lower)))

    m = tree.match([1, 2, 3, 4, 0, 0], touch=False)

    upper = m.path[-1]
    assert seen == [(upper, a)]
    assert upper.parent is tree.root and tree.root.children[(1, 2)] is upper
    assert a.parent is upper and upper.children == {(5, 6): a}
    assert upper.key == (1, 2, 3, 4) and a.key == (5, 6)
    assert [None if v is None else v.tolist() for v in upper.value] == [[0, 1], [1000, 1001], None]
    assert [None if v is None else v.tolist() for v in a.value] == [[2], [1002], None]
    assert upper.state == a.state == ["RESIDENT", "RESIDENT", "H2S_PENDING"]
    assert upper.lock == a.lock == [0, 2, 0]
    assert upper.pending == a.pending == [None, None, 7]
    assert upper.last_access == a.last_access == ticks
    assert tree.pages_held == [3, 3, 0] and tree.audit() == []
    # Unlocking the lower node releases the upper one too: locks count per subtree.
    tree.unlock(a, L2)
    assert upper.lock == a.lock == [0, 1, 0]


def test_match_without_split_stops_at_node_boundary() -> None:
    tree, pager = HiRadixTree(2), Pager()
    a, b = chain(tree, pager, [[1, 2], [3, 4, 5, 6]], [(L1,), (L1,)])
    fired: list[TreeNode] = []
    tree.on_split.append(lambda upper, lower: fired.append(upper))
    m = tree.match([1, 2, 3, 4, 5, 9], split=False)
    assert m.path == (a,) and m.matched_len == 2 and m.lengths == (2, 0, 0)
    assert fired == [] and b.parent is a and len(tree) == 2


def test_cut_names_the_split_match_would_make_and_changes_nothing() -> None:
    tree, pager = HiRadixTree(2), Pager()
    a, b = chain(tree, pager, [[1, 2], [3, 4, 5, 6]], [(L1,), (L1,)])
    ticks = (list(a.last_access), list(b.last_access))
    assert tree.cut([1, 2, 3, 4, 5, 9]) == (b, 2)  # ends inside b after one shared page
    assert tree.cut([1, 2, 3, 4, 5, 6]) is None and tree.cut([7, 7]) is None  # on a boundary
    assert len(tree) == 2 and b.key == (3, 4, 5, 6) and (a.last_access, b.last_access) == ticks
    upper = tree.match([1, 2, 3, 4, 5, 9]).path[-1]
    assert (upper.key, upper.children[(5, 6)]) == ((3, 4), b)


def test_split_rejects_bad_offsets_and_changes_nothing() -> None:
    tree, pager = HiRadixTree(2), Pager()
    (a,) = chain(tree, pager, [[1, 2, 3, 4]], [(L1,)])
    before = snapshot(a)
    for at in (0, 1, 3, 4, 6, -2):
        with pytest.raises(TreeError):
            tree.split(a, at)
    with pytest.raises(TreeError):
        tree.split(tree.root, 2)
    assert snapshot(a) == before and len(tree) == 1


def test_per_tier_lru_order() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b, c = (tree.add_child(tree.root, [k]) for k in (1, 2, 3))
    for n in (a, b, c):
        pager.publish(tree, n, L1)
        pager.publish(tree, n, L2)
    assert tree.candidates(L1) == [a, b, c]
    tree.match([1])  # a is now the most recent in both tiers
    tree.touch(b, L2)  # b is the most recent in L2 only
    assert tree.candidates(L1) == [b, c, a]
    assert tree.candidates(L2) == [c, a, b]


def test_touch_refreshes_ancestors() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b = chain(tree, pager, [[1], [2]], [(L1,), (L1,)])
    other = tree.add_child(tree.root, [9])
    pager.publish(tree, other, L1)
    tree.touch(b, L1)
    tree.set_value(b, L1, None, "ABSENT")  # a becomes an L1 leaf, with b's tick
    assert tree.candidates(L1) == [other, a]
    # A match touches the whole hit run in each tier, not only its deepest node.
    pager.publish(tree, b, L1)
    tree.touch(other, L1)
    tree.match([1, 2])
    tree.set_value(b, L1, None, "ABSENT")
    assert tree.candidates(L1) == [other, a]


def test_locked_and_pending_nodes_are_never_evictable() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b = chain(tree, pager, [[1], [2]], [(L1, L2), (L1, L2)])
    c = tree.add_child(tree.root, [3])
    pager.publish(tree, c, L1)
    tree.lock(b, L1)
    assert tree.candidates(L1) == [c]  # b locked; a is not an L1 leaf
    assert tree.candidates(L2) == [b]  # the L1 lock says nothing about L2
    tree.set_pending(b, L2, 41)
    assert tree.candidates(L2) == []
    # A lock on the parent alone keeps the parent out once it becomes a leaf.
    tree.unlock(b, L1)
    tree.set_value(b, L1, None, "ABSENT")
    tree.lock(a, L1)
    assert tree.candidates(L1) == [c]
    tree.unlock(a, L1)
    assert set(tree.candidates(L1)) == {a, c}


def test_leaf_in_l2_with_l1_only_children_is_evictable_in_l2() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b = chain(tree, pager, [[1], [2]], [(L1, L2), (L1,)])
    assert tree.candidates(L2) == [a]
    assert tree.candidates(L1) == [b]
    # A child with a transfer pending into L2 makes the parent an L2 non-leaf.
    tree.set_value(b, L2, None, "D2H_PENDING")
    assert tree.candidates(L2) == []
    tree.set_value(b, L2, None, "ABSENT")
    assert tree.candidates(L2) == [a]


def test_remove_if_dead_removes_only_empty_unlocked_idle_childless_nodes() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b, c = chain(tree, pager, [[1], [2], [3]], [(L2,), (L1,), (L1,)])
    assert tree.remove_if_dead(c) == []  # holds L1
    tree.set_value(c, L1, None, "ABSENT")
    tree.set_value(b, L1, None, "ABSENT")
    assert tree.remove_if_dead(b) == []  # childless? no: c is still there
    tree.set_pending(c, L2, 5)
    assert tree.remove_if_dead(c) == []  # pending
    tree.set_pending(c, L2, None)
    tree.lock(c, L3)
    assert tree.remove_if_dead(c) == []  # locked
    tree.unlock(c, L3)
    # c and then b are dead; a still holds L2 and stays.
    assert tree.remove_if_dead(c) == [c, b]
    assert c.parent is None and b.parent is None and a.children == {}
    assert list(tree.nodes()) == [a] and tree.audit() == []
    with pytest.raises(TreeError):
        tree.node(c.node_id)
    with pytest.raises(TreeError):
        tree.lock(c, L1)  # a removed handle is refused, not silently counted
    assert tree.remove_if_dead(tree.root) == []


def test_public_reads_name_live_nodes_leaf_sets_and_counters() -> None:
    """What the model checker and the trace checker read (tests/test_layering.py keeps them
    off the tree's private fields): `get` answers None where `node` raises."""
    tree, pager = HiRadixTree(1), Pager()
    assert (tree.tick, tree.next_id, tree.node_ids()) == (0, 1, [0])
    a, b = chain(tree, pager, [[1], [2]], [(L2,), (L1,)])
    assert tree.get(0) is tree.root and tree.get(b.node_id) is b
    assert tree.node_ids() == [0, a.node_id, b.node_id] and tree.next_id == b.node_id + 1
    assert tree.in_leaf_sets(a) == (False, True, False)  # b holds no L2: a is L2's leaf
    assert tree.in_leaf_sets(b) == (True, False, False)
    ticked = tree.tick
    tree.touch(b, L1)
    assert tree.tick == ticked + 1 == b.last_access[L1]
    tree.set_value(b, L1, None, "ABSENT")
    assert tree.remove_if_dead(b) == [b]
    assert tree.get(b.node_id) is None and tree.node_ids() == [0, a.node_id]
    with pytest.raises(TreeError):
        tree.node(b.node_id)


def test_clone_is_equal_and_independent() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b = chain(tree, pager, [[1, 2], [3]], [(L1, L2), (L1,)])
    tree.on_split.append(lambda upper, lower: None)
    twin = tree.clone()
    assert twin.state_key() == tree.state_key() and twin.audit() == []
    assert twin.on_split == [] and twin.get(a.node_id) is not a
    before = tree.state_key()
    twin.match([1, 3])  # splits a in the copy only
    twin.lock(twin.node(b.node_id), L1)
    assert tree.state_key() == before and twin.state_key() != before
    with pytest.raises(TreeError):
        tree.lock(twin.node(b.node_id), L1)  # the copy's nodes are not the original's


def test_unlock_below_zero_raises_and_changes_nothing() -> None:
    tree, pager = HiRadixTree(1), Pager()
    a, b = chain(tree, pager, [[1], [2]], [(L1,), (L1,)])
    tree.lock(a, L1)  # a: 1, b: 0
    with pytest.raises(TreeError, match="hold no lock"):
        tree.unlock(b, L1)
    assert a.lock == [1, 0, 0] and b.lock == [0, 0, 0]
    tree.unlock(a, L1)
    assert a.lock == [0, 0, 0]
    tree.lock(tree.root, L1)  # a zero-length hit: nothing to count
    assert tree.root.lock == [0, 0, 0]


def test_add_child_rejects_misuse_and_changes_nothing() -> None:
    tree, pager = HiRadixTree(2), Pager()
    (a,) = chain(tree, pager, [[1, 2, 3, 4]], [(L1,)])
    for key in ([], [1, 2, 9], [1, 2, 7, 7]):
        with pytest.raises(TreeError):
            tree.add_child(tree.root, key)
    assert tree.root.children == {(1, 2): a} and len(tree) == 1
    other = HiRadixTree(2)
    with pytest.raises(TreeError, match="not live in this tree"):
        other.add_child(a, [5, 6])


def test_set_value_checks_and_counts_pages() -> None:
    tree, pager = HiRadixTree(2), Pager()
    (a,) = chain(tree, pager, [[1, 2, 3, 4]], [()])
    bad = [
        (L1, pages([1]), "RESIDENT"),  # one page short
        (L1, None, "RESIDENT"),  # resident without pages
        (L2, pages([1, 2]), "D2H_PENDING"),  # pending targets live in the op
        (L1, None, "PRIVATE"),  # requests hold private pages, nodes never
        (L1, None, "D2H_PENDING"),  # not an L1 state
        (3, None, "ABSENT"),  # no such tier
        (L1, np.array([[1, 2]]), "RESIDENT"),  # not 1-D
    ]
    for tier, value, state in bad:
        with pytest.raises(TreeError):
            tree.set_value(a, tier, value, state)
    assert a.state == ["ABSENT"] * 3 and tree.pages_held == [0, 0, 0]
    with pytest.raises(TreeError):
        tree.set_value(tree.root, L1, None, "ABSENT")
    src = pages([7, 8])
    tree.set_value(a, L1, src, "RESIDENT")
    src[0] = 99  # the tree keeps its own copy
    kept = a.value[L1]
    assert kept is not None and kept.tolist() == [7, 8]
    assert tree.pages_held == [2, 0, 0]
    tree.set_value(a, L1, None, "ABSENT")
    assert tree.pages_held == [0, 0, 0] and tree.audit() == []


def test_set_pending_refuses_to_replace_another_op() -> None:
    tree = HiRadixTree(1)
    a = tree.add_child(tree.root, [1])
    tree.set_pending(a, L2, 3)
    with pytest.raises(TreeError, match="already pending on op 3"):
        tree.set_pending(a, L2, 4)
    assert a.pending == [None, 3, None]


def test_match_counts_hits_and_accepts_numpy_tokens() -> None:
    tree, pager = HiRadixTree(2), Pager()
    a, b = chain(tree, pager, [[1, 2], [3, 4]], [(L1,), ()])
    m = tree.match(np.array([1, 2, 3, 4], dtype=np.int64))
    assert m.path == (a, b) and m.lengths == (2, 0, 0)
    tree.match([1, 2], touch=False)
    assert (a.hits, b.hits) == (1, 1)
    assert tree.prefix_tokens(b) == 4 and tree.path_to_root(b) == [b, a]
    assert tree.node(b.node_id) is b


def test_bench_control_runs_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tree.json"
    assert (
        bench_main(
            [
                "--tokens",
                "40",
                "64",
                "--background",
                "5",
                "--repeats",
                "1",
                "--page-size",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert [r["aligned_tokens"] for r in result["rows"]] == [40, 64]
    assert all(r["match_hit_us"] > 0 and r["insert_us"] > 0 for r in result["rows"])
    assert "match hit" in capsys.readouterr().out
