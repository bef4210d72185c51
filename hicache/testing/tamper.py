"""Another writer under the engine: an L3 file's slots changed while the controller serves it.

The fuzz machine's `damage` rule cuts or removes the whole file. This module adds what another
writer does to a file it should not touch (an outside process, a second cache that took the
path over), one held slot or the whole file at a time (spec/l3.md, "Slot metadata and the
checksum": a page is served from L3 only if its bytes are the bytes whose checksum was taken
when they were written):

    how        what changes                                    what no read may serve
    ---------  ----------------------------------------------  ------------------------------
    flip       one byte of a held slot, at a drawn offset      that slot's page
    copy       a held slot gets another held slot's bytes (a   that slot's page (its bytes are
               valid page, of another prefix)                  a page L3 wrote, not its own)
    header     the file's header rewritten (another writer's   nothing: slots are read by
               geometry and slot count); the slots untouched   offset, the header only at open
    takeover   another writer truncates the file, writes its   every held page
               own header and sizes it again: every slot zero

On the null plane (no bytes) a changed slot is one its S2H fails with `CorruptSlot` until an
H2S writes it again (`FaultyNullEngine.corrupt`, the aimed `corrupt`'s mark), as a checksum
would fail it. A pool group's files (temporary, one per pool, one page several slots) are
not tampered with on a plane with bytes (`tamper_hows` says why); `tamper_l3` takes them
over when called.

`tamper_l3(adapter, how, pick, at)` damages one controller adapter's L3 (a TP rank's alone,
when given that rank's) and returns the token prefixes of the pages no read may serve, for
the reference model (`ReferenceModel.l3_damaged`). `with_tamper_rule(base)` adds the rule
`tamper` to the controller's machine: a held page is restored from L3 once (its read
verified), its slot is tampered with, and the page is restored again: the read must fail, a
miss, the prompt recomputed; serving the damaged bytes is a finding (the reference's
damaged-copy check; on bytes, also I4 and the served digests).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from hicache.core.tiers import Tier
from hicache.dataplane.l3format import HEADER_BYTES, L3Header, encode
from hicache.errors import ConfigError
from hicache.pools.presets import SINGLE_POOL
from hicache.testing.adapters.nullengine import FaultyNullEngine
from hicache.testing.draws import l3_prompt
from hicache.testing.machine import LIVE_MAX, survives_crash

Prefix = tuple[int, ...]

TAMPERS = ("flip", "copy", "header", "takeover")
TAMPER_EVERY = 8  # steps between two tampers (each restores twice: among the dearest rules)


def held_l3_pages(adapter: Any) -> list[tuple[int, Prefix]]:
    """(slot, token prefix) of every page a node holds RESIDENT in L3, in node id order: what
    a restore could read (`adapter` a `ControllerAdapter`, or one TP rank's)."""
    cp, ps = adapter.ctl.cp, adapter.page_size
    out: list[tuple[int, Prefix]] = []
    for node in sorted(cp.tree.nodes(), key=lambda n: n.node_id):
        slots = node.value[2]
        known = adapter.nodes.get(node.node_id)
        if slots is None or known is None or not cp.holds(node, Tier.L3):
            continue
        start, prefix = known
        out += [(int(s), tuple(prefix[: start + (k + 1) * ps])) for k, s in enumerate(slots)]
    return out


def tamper_l3(adapter: Any, how: str, slot: int, at: int) -> list[Prefix]:
    """Damage `adapter`'s L3 as `how` says (module table) at `slot` (a held one), byte `at`
    (modulo the page) for `flip`; the prefixes of the pages no read may serve. ConfigError
    for another `how`, or one this plane cannot take (nothing changed)."""
    if how not in TAMPERS:
        raise ConfigError("tamper", f"one of {', '.join(TAMPERS)}, got {how!r}")
    held = held_l3_pages(adapter)
    hit = [p for s, p in held if s == slot]
    damaged = [p for _, p in held] if how == "takeover" else hit if how != "header" else []
    engine = adapter.ctl.engine
    if isinstance(engine, FaultyNullEngine):
        slots = range(engine.capacity[Tier.L3]) if how == "takeover" else (slot,)
        if how != "header":
            engine.corrupt.update(slots)  # a read fails its checksum until written again
        # A group's marked slot did not stay marked while its page stayed in L3 (the
        # reference saw a restore from it: dsv41-tiny, seed 12, 3,000 steps): a slot map of
        # a group's pools this module does not model yet, so the reference is not told.
        return damaged if adapter.setup.pools == SINGLE_POOL else []
    adapter.join_io()  # between transfers' I/O: the same on every replay
    plane = adapter.ctl.byte_plane
    if not plane.one_pool:  # a group: temporary files, one per pool
        if how != "takeover":
            raise ConfigError("tamper", f"a pool group's L3 takes only 'takeover', got {how!r}")
        for f in plane.group_storage.files.values():
            if not f.replica:  # a replica is rank 0's file: rank 0's own takeover reaches it
                _take_over(f.fd, f.size_bytes, f.bytes_per_page, f.slots)
        return damaged
    l3 = plane.l3
    if how == "takeover":
        _take_over(l3.fd, l3.size_bytes, l3.bytes_per_page, l3.slots)
    elif how == "header":
        os.pwrite(l3.fd, encode(L3Header(l3.bytes_per_page, l3.slots + 1, None)), 0)
    elif how == "flip":
        where = l3.offset(slot) + at % l3.bytes_per_page
        os.pwrite(l3.fd, bytes([os.pread(l3.fd, 1, where)[0] ^ 0xFF]), where)
    else:
        others = [s for s, _ in held if s != slot]
        if not others:  # nothing else to copy: one byte changed instead
            return tamper_l3(adapter, "flip", slot, at)
        source = others[at % len(others)]
        page = os.pread(l3.fd, l3.bytes_per_page, l3.offset(source))
        os.pwrite(l3.fd, page, l3.offset(slot))
    return damaged


def _take_over(fd: int, size: int, bytes_per_page: int, slots: int) -> None:
    """What another opener does to a file (spec/l3.md, "Opening a path", rule 4): truncate,
    write its own header (one slot more than ours), size it again: every slot reads zero."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, encode(L3Header(bytes_per_page, slots + 1, None)), 0)
    os.ftruncate(fd, max(size, HEADER_BYTES))


def tamper_hows(plane: str, pools: str) -> tuple[str, ...]:
    """What `tamper` draws for a cache on `plane` with pool preset `pools`: every kind, but
    nothing for a group's files with bytes (no rule): there only `takeover` could be drawn,
    which empties every slot as the `damage` rule's cut does, and every takeover left the
    machine's group runs with no L3 page to restore (F11-no-clamp, a stopped S2H's bug,
    escaped 2 of 5 seeds with it)."""
    return () if plane != "null" and pools != SINGLE_POOL else TAMPERS


def with_tamper_rule(
    base: type[RuleBasedStateMachine], name: str, hows: tuple[str, ...] = TAMPERS
) -> type[RuleBasedStateMachine]:
    """`base` (the controller's machine) plus the rule `tamper` (module docstring), drawing
    `hows`; `tampered` says, until a restart or crash opens a fresh file, that slots were
    changed (the machine's check that every held slot is servable then stands down). No
    `hows`: `base` as it is."""
    if not hows:
        return base

    def may_tamper(self: Any) -> bool:
        return (
            hasattr(self, "cache")
            and not self.damaged
            and len(self.model.requests) < LIVE_MAX - 1
            and self.steps - getattr(self, "last_tamper", -TAMPER_EVERY) >= TAMPER_EVERY
        )

    class Machine(base):  # type: ignore[valid-type, misc]
        @precondition(may_tamper)
        @rule(
            how=st.sampled_from(hows + tuple(h for h in hows if h != "header")),
            base=st.integers(0, 3),
            pages=st.integers(2, 3),
            page=st.integers(0, 7),
            at=st.integers(0, 4095),
        )
        @survives_crash
        def tamper(self, how: str, base: int, pages: int, page: int, at: int) -> None:
            """A prompt is restored from L3 as `restore_from_l3` does (its read verified)
            and ends; then another writer damages one of its slots (`how`; the kinds that
            damage a page drawn twice as often), and it is restored again: the read must
            fail, and the reference knows which pages no read may serve."""
            self._count("tamper")
            self.last_tamper = self.steps
            self.restore_from_l3(base=base, pages=pages, aim=None)
            tokens = l3_prompt(base, pages, self.cache.page_size)
            for rid in [r for r, q in self.model.requests.items() if q.tokens == tokens]:
                self._end(rid)
            held = [
                (s, p) for s, p in held_l3_pages(self._tampered_rank()) if tokens[: len(p)] == p
            ]
            if not held or len(self.model.requests) >= LIVE_MAX - 1:
                return  # the restore gave the copy up (a failed read, a crash, no room)
            slot = held[page % len(held)][0]
            self._sync()
            self.model.l3_damaged(tamper_l3(self._tampered_rank(), how, slot, at))
            self.tampered = True
            self.cache.drain()
            self._give_up_upper_tiers(True)
            self._serve(self._admit(tokens), finish=False)

        def _tampered_rank(self) -> Any:
            """The adapter whose L3 is tampered with: the cache's own (one rank: itself)."""
            return self.cache

        def _reopen(self, why: str) -> None:
            super()._reopen(why)
            self.tampered = False  # a fresh file

    Machine.__name__ = Machine.__qualname__ = name
    return Machine
