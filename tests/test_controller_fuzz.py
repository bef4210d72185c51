"""Stateful fuzzing of the controller on the real CPU data plane (real bytes, a real L3 file).

The control-plane machine (`test_control_fuzz.py`) never reached what an outside fuzzer found
through the controller: a restore's own nested make-room evicting its chain, promoted pages
evicted between the stages of an L3 restore, an L3 file truncated or removed underneath, and
`prefill` failing half-way. This machine drives the public API with tight tiers, shared-prefix
prompts (so restores are frequent and nodes split), every write policy, targeted faults
(delay or fail the next transfer, corrupt the next write, fail the next read), eviction
pressure from outside, and aborts in any state. After every step: every invariant (check mode
`every` inside each transition), and the controller's contract -- only the documented errors
escape, and a refused `prefill` changes nothing.

Determinism: before each tick the machine waits for the L3 I/O already issued (without
polling, so DELAY faults still count polls), so a seed replays the same schedule.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.controller.config import WRITE_POLICIES, CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.snapshot import UNSERVABLE
from hicache.core.tiers import TIERS
from hicache.dataplane.faults import FaultInjector, FaultSite
from hicache.dataplane.storage_io import StorageHandle
from hicache.errors import OutOfPages

PS = 4  # the tiny geometry's page size
# Three shared prefixes (2 pages each) and suffixes that diverge after 0, 1 or 2 more pages.
PREFIXES = [tuple(range(1000 * p, 1000 * p + 2 * PS)) for p in (1, 2, 3)]
prompts = st.builds(
    lambda p, extra, tail, salt: (
        PREFIXES[p] + tuple(range(50 * salt, 50 * salt + extra * PS + tail))
    ),
    st.integers(0, 2),
    st.integers(0, 3),
    st.integers(1, PS),
    st.integers(0, 2),
)
NEXT_FAULT = [
    FaultSite.DELAY,
    FaultSite.H2D_COMPLETE,
    FaultSite.D2H_COMPLETE,
    FaultSite.CORRUPT_SLOT,
    FaultSite.IO_EIO,
    FaultSite.SHORT_READ,
    FaultSite.SHORT_WRITE,
]


class ControllerMachine(RuleBasedStateMachine):
    @initialize(
        l1=st.integers(10, 16),
        l2=st.integers(4, 16),
        l3=st.integers(2, 16),
        write_policy=st.sampled_from(WRITE_POLICIES),
        promotion=st.booleans(),
    )
    def setup(self, l1: int, l2: int, l3: int, write_policy: str, promotion: bool) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="hicache-fuzz-")
        self.path = os.path.join(self.dir.name, "l3.slots")
        self.faults = FaultInjector(delay_polls=2)
        cfg = CacheConfig(
            l1_pages=l1,
            l2_pages=l2,
            l3_slots=l3,
            device="cpu",
            backend="torch",
            policy="always",
            write_policy=write_policy,
            promotion=promotion,
            l3_path=self.path,
            io_threads=2,
        )
        self.ctl = CacheController(cfg, faults=self.faults)
        self.next_rid = 1
        self.seen: list[tuple[int, ...]] = []  # prompts admitted so far
        self.damaged = False  # the L3 file was truncated or removed under the cache

    def teardown(self) -> None:
        ctl = getattr(self, "ctl", None)
        if ctl is None:
            return
        for rid in list(ctl.cp.requests):
            ctl.finish(rid)
        ctl.drain()
        # Nothing leaks: no private page, no lock, no op once every request ended.
        assert not ctl.cp.ops and not ctl.handles
        assert all(t.count(1) == 0 for t in ctl.cp.tables), "private pages left behind"
        assert all(n.lock == [0, 0, 0] for n in ctl.cp.tree.nodes()), "a lock left behind"
        # Every page a restore put into L1 was served: pins hold it until cached_len does.
        assert ctl.metrics.restored_unused_pages == 0, "a restored page was recomputed"
        ctl.close()
        self.dir.cleanup()

    def live(self, pick: int) -> int | None:
        rids = sorted(self.ctl.restores)
        return rids[pick % len(rids)] if rids else None

    @precondition(lambda self: len(self.ctl.restores) < 4)
    @rule(tokens=prompts)
    def admit(self, tokens: tuple[int, ...]) -> None:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        self.ctl.admit(rid, tokens)
        self.seen.append(tokens)

    @precondition(lambda self: len(self.ctl.restores) < 3 and bool(self.seen))
    @rule(pick=st.integers(0, 7), twice=st.booleans())
    def admit_again(self, pick: int, twice: bool) -> None:
        """A prompt admitted before, after everything evictable left L1: it is restored, and
        admitted twice at once the second admission shares the first one's load-back."""
        tokens = self.seen[-1 - pick % len(self.seen)]
        self.ctl.drain()  # the backups land in L2 first: L1 then gives up only copies
        self.ctl.cp.evict("L1", 10_000)
        for _ in range(1 + twice):
            self.admit(tokens)

    @rule(tokens=prompts, deep=st.booleans(), site=st.sampled_from([None, *NEXT_FAULT]))
    def restore_round(self, tokens: tuple[int, ...], deep: bool, site: FaultSite | None) -> None:
        """A prompt served, backed up, pushed out and restored, end to end: admitted, ticked
        until ready and prefilled, its backups drained; then once everything evictable left
        L1 (with `deep`, L2 too: a promotion from L3) admitted again, ticked until ready (at
        most 8 ticks), prefilled and finished. Fault `site` is armed for each half (the
        backups' writes, the restore's reads). Requests still live
        are aborted first: their locked prefixes would otherwise leave no room to compute."""
        for rid in sorted(self.ctl.restores):
            self.ctl.finish(rid)
        for again in (False, True):
            if again:
                for tier in ("L1", "L2") if deep else ("L1",):
                    self.ctl.cp.evict(tier, 10_000)
            if site is not None:
                self.faults.once(site)
            rid = self.next_rid
            self.admit(tokens)
            for _ in range(8):
                if self.ctl.ready(rid):
                    break
                self.tick()
            if self.ctl.ready(rid):
                self.prefill(sorted(self.ctl.restores).index(rid))
            if rid in self.ctl.restores:
                self.ctl.finish(rid)
            self.ctl.drain()

    @rule()
    def tick(self) -> None:
        for handle in list(self.ctl.handles.values()):
            if isinstance(handle, StorageHandle):
                handle.tasks.join(None)  # I/O done; the completion is still observed by polling
        self.ctl.tick()

    @precondition(lambda self: bool(self.ctl.restores))
    @rule(pick=st.integers(0, 7))
    def prefill(self, pick: int) -> None:
        rid = self.live(pick)
        assert rid is not None
        if not self.ctl.ready(rid):
            return
        req = self.ctl.cp.requests[rid]
        before = (req.cached_len, self.ctl.metrics.restores, dict(self.ctl.metrics.hit_tokens))
        try:
            self.ctl.prefill(rid)
        except OutOfPages:
            after = (req.cached_len, self.ctl.metrics.restores, dict(self.ctl.metrics.hit_tokens))
            assert after == before, "a refused prefill changed the request"
            return
        self.ctl.finish(rid)

    @precondition(lambda self: bool(self.ctl.restores))
    @rule(pick=st.integers(0, 7))
    def abort(self, pick: int) -> None:
        rid = self.live(pick)
        assert rid is not None
        self.ctl.finish(rid)

    @rule(tier=st.sampled_from(TIERS), pages=st.integers(1, 8))
    def pressure(self, tier: object, pages: int) -> None:
        self.ctl.cp.evict(str(tier), pages)  # another tenant's make-room, between ticks

    @rule(tiers=st.sampled_from(["L1", "L1 L2"]))
    def push_out(self, tiers: str) -> None:
        """Evict everything evictable from the upper tiers: the next admissions of these
        prefixes restore (and, while one is in flight, share a load-back)."""
        for tier in tiers.split():
            self.ctl.cp.evict(tier, 10_000)

    @rule(site=st.sampled_from(NEXT_FAULT))
    def fault_next(self, site: FaultSite) -> None:
        self.faults.once(site)

    @precondition(lambda self: len(self.seen) >= 6)
    @rule(keep_bytes=st.integers(0, 3))
    def truncate_l3(self, keep_bytes: int) -> None:
        """Cut the file under the cache (to a few bytes, or to nothing); only once a few
        prompts were admitted, so that runs also reach L3 restores before L3 goes offline."""
        os.ftruncate(self.ctl.transfer_engine.l3.fd, keep_bytes)
        self.damaged = True

    @precondition(lambda self: os.path.exists(self.path) and len(self.seen) >= 6)
    @rule()
    def remove_l3(self) -> None:
        """Unlink the file under the cache. Its bytes stay (the cache reads and writes
        through the descriptor it holds), so `l3_serves_what_it_holds` stays on: a
        short write taken as complete (B14) is still caught after it."""
        os.unlink(self.path)

    @precondition(lambda self: bool(self.ctl.handles))  # else a no-op that crowds out the rest
    @rule()
    def drain(self) -> None:
        self.ctl.drain()

    @invariant()
    def l3_serves_what_it_holds(self) -> None:
        """Unless the L3 file was damaged (a CORRUPT_SLOT fault, the file cut or removed),
        every slot the tree holds is servable and no read failed its checksum: short and
        failed I/O is resumed or fails its transfer, never leaves a slot half written or a
        page half read (B14)."""
        if self.damaged or self.faults.fired.get(FaultSite.CORRUPT_SLOT, 0) > 0:
            return
        assert self.ctl.transfer_engine.l3.corrupt_reads == 0, (
            f"{self.ctl.transfer_engine.l3.corrupt_reads} corrupt read(s) "
            "of an L3 file nothing damaged"
        )
        held = [v for n in self.ctl.cp.tree.nodes() if (v := n.value[2]) is not None]
        if held:
            digests = self.ctl.transfer_engine.digests("L3", np.concatenate(held))
            assert not (digests == UNSERVABLE).any(), "an L3 slot the tree holds fails its checksum"

    @invariant()
    def every_lock_has_a_holder(self) -> None:
        # A lock count never drops below what its children hold (audit), never negative.
        assert self.ctl.cp.tree.audit() == []


_profile = settings()  # the loaded profile (dev, ci or fuzz)
ControllerMachine.TestCase.settings = settings(
    _profile,
    max_examples=min(_profile.max_examples, 40)
    if _profile.max_examples < 1000
    else _profile.max_examples,
    stateful_step_count=30,
    deadline=None,
)
TestControllerMachine = ControllerMachine.TestCase
