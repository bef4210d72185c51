"""One reference event against one trace event: equal field by field, ids through the maps.

    field                        compared
    ---------------------------  -----------------------------------------------------------
    event, tier, request,        equal
    token_start, token_end
    before, after                equal, unless the header omits `states`
    node, detail.upper (split)   through the node map (bound on first sight)
    op                           through the op map
    pages                        through the tier's page map, unless the header omits `pages`:
                                 a reserve binds (a page still owned is a double ownership),
                                 a publish must name the bound pages, a release or free too
                                 (and unbinds them)
    detail                       equal (split: `at`; begin_request: `hit`, `tokens`, `prompt`)

`Mismatch` says which field differs and what the reference has there; `DoubleOwnership` is
the ownership invariant (I1) a reserve of a page still owned breaks.
"""

from __future__ import annotations

from collections.abc import Mapping

from hicache.core.control import ControlPlane
from hicache.core.lifecycle import Lifecycle
from hicache.core.pages import FREE, OWNER_NAMES
from hicache.core.tiers import TIERS, tier_index
from hicache.core.trace import TraceEvent
from hicache.invariants.registry import get_check
from hicache.oracle.checktrace.maps import IdMap, PageMap

_PLAIN = ("tier", "request", "token_start", "token_end")
OWNERSHIP_OPS = ("reserve", "publish", "release", "free")


class Mismatch(Exception):
    """The trace event differs from what the reference emitted; `why` names the field."""

    def __init__(self, why: str, ref: TraceEvent | None) -> None:
        self.why, self.ref = why, ref
        super().__init__(why)


class DoubleOwnership(Exception):
    """A reserve names an engine page still owned: I1 (`ownership_disjoint`) broken."""

    def __init__(self, invariant: str, why: str) -> None:
        self.invariant, self.why = invariant, why
        super().__init__(why)


def ownership_ops(lc: Lifecycle) -> dict[str, str]:
    """Event name -> its row's ownership effect (reserve / publish / release / free)."""
    return {
        t.name: e.op for t in lc.transitions.values() for e in t.effects if e.op in OWNERSHIP_OPS
    }


HELD_PAGES = {"tombstone": "held", "revive": "held"}
"""A pool group's window events: their pages are a node's anchor pages, bound already and
still the node's after (only side pools move): they must agree through the page map."""


class Comparer:
    """Compares reference events with trace events and keeps the maps
    (`hicache.oracle.checktrace.maps`)."""

    def __init__(self, cp: ControlPlane, lc: Lifecycle, omits: tuple[str, ...]) -> None:
        self.cp = cp
        self.nodes, self.ops = IdMap("node"), IdMap("op")
        self.pages = {str(t): PageMap(str(t)) for t in TIERS}
        self.states = "states" not in omits
        self.with_pages = "pages" not in omits
        self.effect = ownership_ops(lc)

    def compare(self, ref: TraceEvent, got: TraceEvent) -> None:
        """Mismatch / DoubleOwnership unless `got` is `ref` in the trace's ids; binds ids."""
        if got.event != ref.event:
            raise Mismatch(
                f"the trace has {got.event} where the reference emitted {ref.event}", ref
            )
        plain = (
            got.tier == ref.tier
            and got.request == ref.request
            and got.token_start == ref.token_start
            and got.token_end == ref.token_end
            and (not self.states or (got.before == ref.before and got.after == ref.after))
        )
        if not plain:  # the slow path names the field
            for key in _PLAIN:
                self._same(key, getattr(ref, key), getattr(got, key), ref)
            self._same("before", ref.before, got.before, ref)
            self._same("after", ref.after, got.after, ref)
        # Ids already bound to each other agree (the common case, read inline); any other
        # pair is bound, or refused, by `_ids`.
        want, have = ref.node, got.node
        if (want is not None or have is not None) and (
            want is None or have is None or self.nodes.to_ref.get(have) != want
        ):
            self._ids(self.nodes, "node", want, have, ref)
        want, have = ref.op, got.op
        if (want is not None or have is not None) and (
            want is None or have is None or self.ops.to_ref.get(have) != want
        ):
            self._ids(self.ops, "op", want, have, ref)
        if ref.detail or got.detail:
            self._detail(ref, got)
        if self.with_pages:
            self._pages(ref, got)
        if ref.event == "node_remove" and ref.node is not None:
            self.nodes.drop_ref(ref.node)

    def retire_ops(self) -> None:
        """Unbind every op the reference no longer has pending."""
        if self.ops.to_engine.keys() <= self.cp.ops.keys():
            return  # every bound op is pending (the common case, one C-level test)
        for ref in [r for r in self.ops.to_engine if r not in self.cp.ops]:
            self.ops.drop_ref(ref)

    def _same(self, key: str, want: object, have: object, ref: TraceEvent) -> None:
        if want != have:
            raise Mismatch(f"{key}: the trace has {_text(have)}, the reference {_text(want)}", ref)

    def _ids(self, m: IdMap, key: str, want: int | None, have: int | None, ref: TraceEvent) -> None:
        if (want is None) != (have is None):
            raise Mismatch(
                f"{key}: the trace has {_text(have)}, the reference "
                f"{'none' if want is None else 'one'}",
                ref,
            )
        if want is not None and have is not None:
            why = m.match(have, want)
            if why is not None:
                raise Mismatch(why, ref)

    def _detail(self, ref: TraceEvent, got: TraceEvent) -> None:
        if ref.event == "split":
            upper, mine = ref.detail.get("upper"), got.detail.get("upper")
            assert isinstance(upper, int) and isinstance(mine, int)  # Verify: schema and reference.
            self._same("detail.at", ref.detail.get("at"), got.detail.get("at"), ref)
            self._ids(self.nodes, "detail.upper", upper, mine, ref)
            return
        for key in sorted(set(ref.detail) | set(got.detail)):
            self._same(f"detail.{key}", ref.detail.get(key), got.detail.get(key), ref)

    def _pages(self, ref: TraceEvent, got: TraceEvent) -> None:
        op = self.effect.get(ref.event) or HELD_PAGES.get(ref.event)
        if op is None:
            if ref.pages != got.pages:  # `_same`'s test, inline: the call only to refuse
                self._same("pages", ref.pages, got.pages, ref)
            return
        if len(got.pages) != len(ref.pages):
            raise Mismatch(
                f"pages: the trace moves {len(got.pages)} page(s), the reference {len(ref.pages)}",
                ref,
            )
        assert ref.tier is not None  # Verify: every lifecycle event names its tier.
        m = self.pages[ref.tier]
        if op == "reserve":
            self._reserve(m, ref, got)
            return
        why = m.agree(got.pages, ref.pages)
        if why is not None:
            raise Mismatch(f"pages: {why}", ref)
        if op in ("release", "free"):
            m.unbind(ref.pages)

    def _reserve(self, m: PageMap, ref: TraceEvent, got: TraceEvent) -> None:
        table = self.cp.tables[tier_index(ref.tier)]
        mine = set(ref.pages)
        owned = [
            (r := m.to_ref.get(e)) is not None and r not in mine and table.owner[r] != FREE
            for e in got.pages
        ]
        twice = m.bind(got.pages, ref.pages, owned)
        if twice is not None:
            check = get_check("I1")
            held = m.to_ref.get(twice)
            what = (
                "named twice in this event"
                if held is None or held in mine
                else f"still {OWNER_NAMES[int(table.owner[held])]}{self._holder(ref.tier, held)}"  # type: ignore[arg-type]
            )
            raise DoubleOwnership(
                f"{check.id} {check.name}",
                f"trace {ref.tier} page {twice}: reserved while {what}; {check.summary}",
            )

    def _holder(self, tier: str, ref_page: int) -> str:
        """Who holds reference page `ref_page` of `tier`, in the trace's ids."""
        node = self.cp.holder(tier, ref_page)
        if node is not None:
            return f" (held by {self.nodes.engine_name(node.node_id)})"
        for op in self.cp.ops.values():
            if str(op.direction.target) == tier and ref_page in op.target_pages:
                return f" (the target of {self.ops.engine_name(op.op_id)})"
        for r in self.cp.requests.values():
            if tier == "L1" and ref_page in r.private_pages:
                return f" (private to trace request {r.request_id})"
        return ""


def _text(v: object) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(str(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return str(dict(v))
    return "none" if v is None else str(v)
