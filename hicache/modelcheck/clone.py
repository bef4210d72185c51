"""Branching the search: an independent copy of a control plane, made field by field.

The search tries every action on its own copy of the state it expands. `copy.deepcopy` of a
small plane costs about 0.4 ms (it walks the lifecycle tables, the tracer, every numpy array
through the generic protocol); this copy rebuilds only the mutable records and shares what no
transition mutates:

    shared (never mutated in place)        copied
    -------------------------------------  ----------------------------------------------
    the lifecycle tables, page_size        every TreeNode (its per-tier lists, children)
    page arrays (node values, an op's      the tree's node index, leaf sets, counters
    source and target pages, a request's   each PageTable's owner and generation arrays
    private pages: every writer replaces   the op table, the requests (their pins)
    them, none writes into one)            a fresh Tracer (no sink) and InvariantChecker

`tests/test_modelcheck.py` checks the copy against `copy.deepcopy` (same concrete state) and
its independence (every action on the copy leaves the original's concrete state unchanged).
"""

from __future__ import annotations

from hicache.control import ControlPlane
from hicache.invariants.checker import InvariantChecker
from hicache.pages import PageTable
from hicache.pools.table import GroupTable
from hicache.pools.tierpools import TierPools
from hicache.records import PendingOp, Request
from hicache.trace import Tracer
from hicache.tree import HiRadixTree, TreeNode


def clone(cp: ControlPlane) -> ControlPlane:
    """An independent copy of `cp` with tracing off and the same check mode."""
    new: ControlPlane = object.__new__(type(cp))
    new.__dict__.update(cp.__dict__)
    tree, nodes = _clone_tree(cp.tree)
    new.tree = tree
    new.tables = tuple(_clone_table(t) for t in cp.tables)
    new.ops = {
        i: PendingOp(
            op.op_id,
            op.direction,
            [nodes[n.node_id] for n in op.nodes],
            op.source_pages,
            op.target_pages,
            op.request_id,
        )
        for i, op in cp.ops.items()
    }
    new.requests = {
        i: Request(
            r.request_id,
            r.tokens,
            nodes[r.locked.node_id],
            r.published_len,
            r.cached_len,
            r.private_pages,
            r.private_start,
            [(nodes[n.node_id], t) for n, t in r.pins],
        )
        for i, r in cp.requests.items()
    }
    new.tracer = Tracer()
    new.checker = InvariantChecker(cp.checker.mode, cp.checker.checks)
    executor = object.__new__(type(cp.executor))
    executor.__dict__.update(cp.executor.__dict__)  # a recording executor keeps its shared set
    executor.tree, executor.tables, executor.tracer = tree, new.tables, new.tracer
    new.executor = executor
    tree.on_split = [new._on_split]
    return new


_NODE_SLOTS = {
    "node_id",
    "key",
    "hits",
    "page_size",
    "is_root",
    "value",
    "state",
    "lock",
    "pending",
    "last_access",
    "present_children",
    "parent",
    "children",
}
# Verify the node copy below sets every slot TreeNode has (a slot added later must be copied too).
assert _NODE_SLOTS == set(TreeNode.__slots__), set(TreeNode.__slots__) ^ _NODE_SLOTS


def _clone_tree(tree: HiRadixTree) -> tuple[HiRadixTree, dict[int, TreeNode]]:
    new: HiRadixTree = object.__new__(HiRadixTree)
    new.__dict__.update(tree.__dict__)
    nodes: dict[int, TreeNode] = {}
    new_node = TreeNode.__new__
    for nid, old in tree._nodes.items():
        n: TreeNode = new_node(TreeNode)
        n.node_id, n.key, n.hits, n.page_size, n.is_root = (
            nid,
            old.key,
            old.hits,
            old.page_size,
            old.is_root,
        )
        n.value, n.state, n.lock = old.value[:], old.state[:], old.lock[:]
        n.pending, n.last_access, n.present_children = (
            old.pending[:],
            old.last_access[:],
            old.present_children[:],
        )
        nodes[nid] = n
    for nid, old in tree._nodes.items():
        n = nodes[nid]
        parent = old.parent
        n.parent = None if parent is None else nodes[parent.node_id]
        n.children = {k: nodes[c.node_id] for k, c in old.children.items()}
    new._nodes = nodes
    new.root = nodes[tree.root.node_id]
    new._leaves = [{i: nodes[i] for i in leaves} for leaves in tree._leaves]
    new.pages_held = list(tree.pages_held)
    return new, nodes


def _clone_table(t: PageTable) -> PageTable:
    if isinstance(t, TierPools):
        return _clone_pools(t)
    new: PageTable = object.__new__(PageTable)
    new.__dict__.update(t.__dict__)
    new.owner = t.owner.copy()
    new.generation = t.generation.copy()
    return new


def _clone_pools(t: TierPools) -> TierPools:
    """A pool group's table: every pool's table cloned, the anchor's arrays shared with the
    clone's own owner / generation as in the original."""
    gt: GroupTable = object.__new__(GroupTable)
    gt.__dict__.update(t.group_table.__dict__)
    gt.tables = {name: _clone_table(table) for name, table in t.group_table.tables.items()}
    new: TierPools = object.__new__(TierPools)
    new.__dict__.update(t.__dict__)
    new.group_table = gt
    new.owner, new.generation = gt.tables[t.anchor].owner, gt.tables[t.anchor].generation
    new.held_by = {name: held.copy() for name, held in t.held_by.items()}
    return new
