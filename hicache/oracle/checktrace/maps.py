"""The engine's ids and pages, mapped onto the reference's.

An engine numbers its nodes, ops and physical pages its own way; only the structure must
agree. Each map is a bijection built as the replay goes: an engine id is bound to the
reference's id the first time an event names both, and every later event must name the same
pair. The checker unbinds what the reference retires (a removed node, an ended op, a freed or
released page), so an engine may reuse its ids and pages afterwards.

    map       bound at                              unbound at
    --------  ------------------------------------  -------------------------------------
    nodes     first event naming the node (split:   the reference's `node_remove` (one the
              its `detail.upper` too)               trace omits too, after the events
                                                    before it were compared)
    ops       the op's first `*_issue` event        the op's end (complete / fail / cancel)
    pages     a `reserve` (compute, *_issue): one   a `release` or `free` of the page
    (per      map per tier
    tier)

A page the engine reserves while the reference page it is bound to is still owned (private
to a request or op, or held by a node) is a double ownership: `PageMap.bind` reports it.
"""

from __future__ import annotations

from collections.abc import Sequence


class IdMap:
    """A bijection engine id <-> reference id for one kind of thing (nodes, ops)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.to_ref: dict[int, int] = {}
        self.to_engine: dict[int, int] = {}

    def match(self, engine: int, ref: int) -> str | None:
        """Bind `engine` to `ref` on first sight; why the pair contradicts earlier bindings,
        or None when it agrees with them."""
        bound = self.to_ref.get(engine)
        if bound is not None:
            if bound == ref:
                return None
            other = self.to_engine.get(ref)
            named = f" (trace {self.kind} {other})" if other is not None else ""
            return (
                f"trace {self.kind} {engine} still names the reference's {self.kind} {bound}, "
                f"which lives, but this event stands for the reference's {self.kind} {ref}"
                f"{named}: an id is named anew only after its {self.kind} is gone "
                '(spec/trace.md, "Partial traces")'
            )
        back = self.to_engine.get(ref)
        if back is not None:
            return (
                f"the reference's {self.kind} {ref} is trace {self.kind} {back}, "
                f"but this event names trace {self.kind} {engine}"
            )
        self.to_ref[engine] = ref
        self.to_engine[ref] = engine
        return None

    def drop_ref(self, ref: int) -> None:
        engine = self.to_engine.pop(ref, None)
        if engine is not None:
            self.to_ref.pop(engine, None)

    def engine_name(self, ref: int) -> str:
        """How a report names the reference's `ref`: `trace node 7` (the trace's id) when
        bound, else `the reference's node 3 (unnamed in the trace)`."""
        engine = self.to_engine.get(ref)
        return (
            f"trace {self.kind} {engine}"
            if engine is not None
            else f"the reference's {self.kind} {ref} (unnamed in the trace)"
        )


class PageMap:
    """Engine physical page <-> reference physical page, for one tier."""

    def __init__(self, tier: str) -> None:
        self.tier = tier
        self.to_ref: dict[int, int] = {}
        self.to_engine: dict[int, int] = {}

    def bind(self, engine: Sequence[int], ref: Sequence[int], owned: Sequence[bool]) -> int | None:
        """Bind each engine page to the reference page reserved for it. `owned[i]`: whether
        the reference page engine page i is bound to now (if any) is still owned by someone
        other than this reservation. Returns the first engine page that is owned twice (named
        twice here, or still bound to an owned reference page), binding nothing; else None."""
        seen: set[int] = set()
        for e, is_owned in zip(engine, owned):
            if e in seen or (e in self.to_ref and is_owned):
                return e
            seen.add(e)
        for e, r in zip(engine, ref):
            old = self.to_ref.pop(e, None)
            if old is not None:
                self.to_engine.pop(old, None)
            stale = self.to_engine.pop(r, None)
            if stale is not None:
                self.to_ref.pop(stale, None)
            self.to_ref[e] = r
            self.to_engine[r] = e
        return None

    def agree(self, engine: Sequence[int], ref: Sequence[int]) -> str | None:
        """Why the engine's pages are not the ones bound to the reference's, or None."""
        for e, r in zip(engine, ref):
            got = self.to_ref.get(e)
            if got != r:
                want = self.to_engine.get(r)
                have = (
                    f"trace page {want}" if want is not None else "a page the trace never reserved"
                )
                where = (
                    "was never reserved in the trace"
                    if got is None
                    else f"is the reference's page {got}"
                )
                return (
                    f"trace {self.tier} page {e} {where}; the reference moves its page {r} "
                    f"here ({have})"
                )
        return None

    def unbind(self, ref: Sequence[int]) -> None:
        for r in ref:
            e = self.to_engine.pop(r, None)
            if e is not None:
                self.to_ref.pop(e, None)
