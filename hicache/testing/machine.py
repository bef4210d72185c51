"""The fuzz machine: `CacheMachine`, a Hypothesis `RuleBasedStateMachine` over any
`CacheUnderTest`. An engine's test subclasses it, naming its adapter and the setups to draw:

    from hypothesis import strategies as st
    from hicache.testing import CacheMachine, EngineConfig

    class MyCacheMachine(CacheMachine):
        adapter = staticmethod(my_factory)        # EngineConfig -> a CacheUnderTest
        setups = st.just(EngineConfig(4, {"L1": 16, "L2": 32}))

    TestMyCache = MyCacheMachine.TestCase         # pytest finds it

(`make_machine(adapter, setups, ...)` builds the same subclass from arguments.) The rules
are grouped by theme below -- requests, restores, transfers, faults, pressure, storage damage
and restarts -- and a subclass may add its own (the controller's machines add illegal calls,
the trace self-check, L3 tampering and TP ends: hicache/testing/machines.py).

Rules (each a step; preconditions, never `assume`, decide when one may run):

    rule         what it does
    -----------  ---------------------------------------------------------------------------
    submit       admit a prompt from a bundle of shared prefixes with divergent suffixes, so
                 nodes split (also while transfers on them are pending)
    resubmit     admit an earlier prompt the cache holds again (once, or twice at once to
                 share a load-back) after evicting L1 (and L2, for an L3 restore): restores
                 on every run, some racing the prompt's own L3 backup
    tick         one scheduler / decode step (the oldest 0-2 transfers end first); only
                 while the engine has work (`has_work`)
    complete     a chosen pending transfer succeeds (per the fault schedule), then a tick
    fail         a chosen pending transfer fails (error, corrupt or unreadable), then a tick
    aimed        a fault aimed at the next transfer into a tier (refused reservation, crash,
                 a failure of `fail`'s kinds, or -- a pool group's engine -- an L3 read
                 that stops part way per pool), then a resubmit that issues that transfer
    prefill      a ready request is served: restored pages used, the rest computed (when
                 refused for room, the oldest served request ends first); not ready: a tick
    finish       a served request ends normally
    abort        a chosen live request ends, in whatever state it is
    restore_from_l3  a fresh two-node prompt (2-5 pages) served until every write policy
                 backs it up, drained, given up by L1 and L2, then admitted again: an S2H
                 and a load-back, the S2H meeting an aimed fault or none, then served
    failed_restore_then_full_l1  a load-back fails; a second request loads the prompt and
                 ends; other prompts fill L1; then the first is served
    cancel_restore  an earlier prompt restored again, and the request (or a second one
                 sharing its load-back) gives the restore up in flight and stays: then it
                 is served (what L1 published; the rest computed)
    pressure     eviction pressure on a chosen tier holding a page no live request's
                 prompt begins with
    faults       a new fault schedule: each site on with some probability, then a rate
                 (every site: allocation refusals and the crash before publication too)
    damage       the L3 file is cut or removed under the cache (once per cache, after a few
                 admissions): restores from L3 then fail into recomputation
    drain        every transfer ends and is applied
    restart      close and open again (a cache holding something)

A crash (`SimulatedCrash`, the schedule's CRASH_BEFORE_PUBLISH) may end any step that
observes a transfer: the step stops there, the machine closes and reopens the engine, and
the reference model starts empty, as after `restart` (spec/faults.md: nothing survives,
not even what L3 held before the crash).

After every step: the engine's own checks (`check()`: for the controller, every invariant and
structural check over its snapshot), then the differential check against the reference model
(hicache/testing/reference.py): page steps, each tier closed under ancestors, on one tier the
eviction order, hit lengths, `cached_len`, the live set, served bytes. Inside the steps the
machine also makes the calls the protocol says an engine refuses (`_verify_refused`: an empty
prompt, a prompt one token more than L1 holds when the setup says how much (`l1_prompt_pages`),
a live id admitted again, a served request prefilled again, an ended request prefilled or
finished again): each must raise a `HiCacheError` and change nothing; a prefill refused for
room must lack it (not a request alone with nothing in flight); after a crash, an engine
that lives on (`refuses_when_dead`) must so refuse every call until it is reopened (R57).
`Coverage` (coverage.py), when given, collects each run's trace and fault counts.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hicache.dataplane.faults import SimulatedCrash
from hicache.testing.coverage import Coverage
from hicache.testing.draws import l3_prompt, prompts, schedules
from hicache.testing.protocol import CacheUnderTest, FaultSchedule
from hicache.testing.reference import Mismatch, ReferenceModel, verify_refused

LIVE_MAX = 4  # live requests at once (each holds its L1 prefix locked)
QUIET_STEPS = 8  # steps between fault-schedule changes, cancelled restores (restarts: 2x,
# restores from L3: half)
FAIL_KINDS = ("error", "corrupt", "unreadable")
AIMS = ("refuse", "crash") + FAIL_KINDS  # faults aimed at one transfer (`aimed`)
GROUP_AIMS = AIMS + ("partial",)  # a pool group's engines: an L3 read stops part way per pool
READ_AIMS = ("corrupt", "unreadable", "partial")  # the aims only an L3 read (S2H) meets
DAMAGE_AFTER = 20  # admissions into one cache before its L3 file may be damaged
EVERYTHING = 10_000  # pages an `evict` asks for to give up all a tier can

Step = TypeVar("Step", bound=Callable[..., None])

AdapterFactory = Callable[[Any], CacheUnderTest]


def survives_crash(step: Step) -> Step:
    """A rule that may meet a crash: the step ends there and the machine reopens the engine
    (`_reopen`), as a supervisor restarts a process that died."""

    @functools.wraps(step)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            step(self, *args, **kwargs)
        except SimulatedCrash:
            self._verify_dead()
            self._reopen("crash")

    return guarded  # type: ignore[return-value]


def _drawn(strategy_of: Callable[[type[CacheMachine]], st.SearchStrategy[Any]]) -> Any:
    """A rule argument drawn from a strategy the running machine's class decides (its
    `setups`, its prompts' page size, its aims): `st.runner()` is the machine in a stateful
    test, so one rule serves every subclass."""
    return st.runner().flatmap(lambda machine: strategy_of(type(machine)))


@functools.cache
def _prompts(page_size: int) -> st.SearchStrategy[tuple[int, ...]]:
    return prompts(page_size)


@functools.cache
def _sampled(values: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(values)


@functools.cache
def _aims_of_a_read(aims: tuple[str, ...]) -> st.SearchStrategy[str | None]:
    """`restore_from_l3`'s aim: none, or one of `aims`, the aims only a read meets drawn
    twice as often."""
    return st.sampled_from((None, *aims, *(a for a in aims if a in READ_AIMS)))


class CacheMachine(RuleBasedStateMachine):
    """The machine (module docstring). A subclass names what it drives in class attributes:

        class MyCacheMachine(CacheMachine):
            adapter = staticmethod(my_factory)    # setup -> a CacheUnderTest
            setups = st.just(EngineConfig(4, {"L1": 16, "L2": 32}))

        TestMyCache = MyCacheMachine.TestCase    # pytest finds it

    `adapter(setup)` opens one engine per run, `setup` drawn from `setups`; `page_size` shapes
    the prompts (the adapter's own must match); `coverage`, when set, collects every run's
    trace and fault counts; `aims` are the actions `aimed` draws (`GROUP_AIMS` for an engine
    with a pool group); `refusals`: make the calls the protocol refuses, checking each is
    refused. `make_machine` builds such a subclass from arguments."""

    adapter: ClassVar[AdapterFactory]
    setups: ClassVar[st.SearchStrategy[Any]]
    page_size: ClassVar[int] = 4
    coverage: ClassVar[Coverage | None] = None
    aims: ClassVar[Sequence[str]] = AIMS
    refusals: ClassVar[bool] = True

    @initialize(setup=_drawn(lambda m: m.setups))
    def start(self, setup: Any) -> None:
        self.cache = type(self).adapter(setup)
        self.model = ReferenceModel(
            self.cache.page_size,
            self.cache.tiers,
            getattr(self.cache, "hit_window", 0),
            getattr(self.cache, "replay_window", 0),
            tier_closure=getattr(self.cache, "tier_closure", "tier"),
            duplicate_copies=getattr(self.cache, "duplicate_copies", False),
            hash_keyed_tiers=getattr(self.cache, "hash_keyed_tiers", ()),
            persistent_tiers=getattr(self.cache, "persistent_tiers", ()),
        )
        self.next_rid = 1
        self.seen: list[tuple[int, ...]] = []
        self.prefilled: set[int] = set()
        self.steps = self.last_faults = self.last_restart = self.last_cancel = 0
        self.last_l3_restore = -QUIET_STEPS  # the first may come at once
        self.admitted = 0  # admissions into the cache as now opened
        self.damaged = False  # its L3 file was cut or removed (`damage`)
        self._verify_refused("submit of an empty prompt", lambda: self.cache.submit(0, ()))
        pages = getattr(setup, "l1_prompt_pages", None)  # L1's bound: one token more is refused
        if pages is not None:
            big = tuple(range(pages * self.cache.page_size + 1))
            self._verify_refused(
                f"submit of {len(big)} tokens, more than L1 holds",
                lambda: self.cache.submit(0, big),
            )

    # -- requests: admission, serving, ending -----------------------------------------------

    def teardown(self) -> None:
        cache = getattr(self, "cache", None)
        if cache is None:
            return
        try:
            cache.close()
        finally:
            if self.coverage is not None:
                self.coverage.add(cache.trace(), cache.fault_counts())

    def _live(self, pick: int, served: bool | None = None) -> int:
        rids = sorted(
            r for r in self.model.requests if served is None or (r in self.prefilled) == served
        )
        return rids[pick % len(rids)]

    @precondition(lambda self: len(self.model.requests) < LIVE_MAX)
    @rule(tokens=_drawn(lambda m: _prompts(m.page_size)), serve=st.integers(0, 2))
    @survives_crash
    def submit(self, tokens: tuple[int, ...], serve: int) -> None:
        """Admit; `serve` 1: then tick (transfers ending in order) until ready, and
        prefill; 2: and finish. So every run serves, backs up and restores."""
        self._count("submit")
        rid = self._admit(tokens)
        if serve:
            self._serve(rid, finish=serve == 2)

    def _serve(self, rid: int, finish: bool) -> None:
        """Tick (transfers ending in order) until the request is ready, prefill it, and,
        `finish`, end it."""
        for _ in range(8):
            if rid not in self.model.requests or self.cache.ready(rid):
                break
            self.tick(2)
        self._sync()
        if rid in self.model.requests and rid not in self.prefilled and self.cache.ready(rid):
            self._prefill(rid)
            if finish and rid in self.prefilled:
                self._end(rid)

    def _admit(self, tokens: tuple[int, ...]) -> int:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        self._sync()  # the model as the engine is now (resubmit admits twice in a step)
        got = self.cache.submit(rid, tokens)
        self.model.admit(rid, tokens, got)
        self.seen.append(tokens)
        self.admitted += 1
        self._sync()
        self._verify_refused(
            f"submit of live request {rid} again", lambda: self.cache.submit(rid, tokens)
        )
        return rid

    @precondition(lambda self: any(r not in self.prefilled for r in self.model.requests))
    @rule(pick=st.integers(0, 7))
    @survives_crash
    def prefill(self, pick: int) -> None:
        """A request not served yet: when its restore is still in flight, one decode step
        (the oldest transfer ends); when ready, it is served -- and when others hold L1
        so that it is refused, the oldest served request ends and it is tried again."""
        self._count("prefill")
        rid = self._live(pick, served=False)
        if not self.cache.ready(rid):
            self.tick(1)
            return
        self._prefill(rid)
        others = sorted(self.prefilled)
        if rid in self.model.requests and rid not in self.prefilled and others:
            self._end(others[0])
            self._prefill(rid)

    def _prefill(self, rid: int) -> None:
        self._sync()
        landing = getattr(self.cache, "landing", None)  # an engine's layer-wise load-back
        own = landing(rid) if landing is not None else None
        expected = self.model.expected_after_prefill(rid, own)
        fired = sum(self.cache.fault_counts().values())
        alone = set(self.model.requests) == {rid} and not self.cache.pending_ops()
        if self.cache.prefill(rid):
            self._sync()  # its make-room ran before the request was served more
            self.model.prefilled(rid, expected, self.cache.cached_len(rid))
            self.prefilled.add(rid)
            self.model.served(rid, self.cache.served_digests(rid))
            self._verify_refused(
                f"prefill of served request {rid}", lambda: self.cache.prefill(rid)
            )
            return
        # Verify a prefill refused for room changed nothing, no eviction either (a
        # rejected operation leaves no trace; the protocol's `prefill` contract) -- but the
        # end of the request's own landing load-back, which it applied first (R82).
        changed = self.cache.changes()
        if own is not None:
            tier, tokens = self.model.tiers[0], self.model.requests[rid].tokens
            changed = [
                c
                for c in changed
                if not (c.tier == tier and own[0] < len(c.prefix) <= own[1])
                or c.prefix != tokens[: len(c.prefix)]
            ]
        if changed:
            raise Mismatch("page changes of a refused prefill", changed[:4], [], f"request {rid}")
        # A refusal for room needs a lack of room: alone in the cache (no other request, no
        # transfer holding a page), a prompt L1 admitted fits once what nobody holds is
        # evicted -- unless a fault made the reservation fail (ALLOC_L1, as if L1 were full).
        if alone and sum(self.cache.fault_counts().values()) == fired:
            raise Mismatch(
                "prefill refused for room",
                f"request {rid} refused, alone in the cache with nothing in flight",
                "served: what no request or transfer holds can be evicted to make room",
            )

    @precondition(lambda self: bool(self.prefilled))
    @rule(pick=st.integers(0, 7))
    @survives_crash
    def finish(self, pick: int) -> None:
        self._count("finish")
        self._end(self._live(pick, served=True))

    @precondition(lambda self: bool(self.model.requests))
    @rule(pick=st.integers(0, 7))
    @survives_crash
    def abort(self, pick: int) -> None:
        self._count("abort")
        self._end(self._live(pick))

    def _end(self, rid: int) -> None:
        self.cache.finish(rid)
        self.model.finished(rid)
        self.prefilled.discard(rid)
        self._sync()
        self._verify_refused(f"finish of ended request {rid}", lambda: self.cache.finish(rid))
        self._verify_refused(f"prefill of ended request {rid}", lambda: self.cache.prefill(rid))

    def _verify_refused(self, what: str, call: Callable[[], object]) -> None:
        if self.refusals:
            verify_refused(self.cache, what, call)

    # -- restores: a prompt a lower tier holds comes back -----------------------------------

    @precondition(lambda self: len(self.model.requests) < LIVE_MAX - 1 and bool(self.seen))
    @rule(
        pick=st.integers(0, 7),
        twice=st.booleans(),
        deep=st.booleans(),
        settle=st.integers(0, 2),
        abort_first=st.booleans(),
        aim=st.sampled_from((None, None) + FAIL_KINDS),
    )
    @survives_crash
    def resubmit(
        self,
        pick: int,
        twice: bool,
        deep: bool,
        settle: int,
        abort_first: bool,
        aim: str | None,
    ) -> None:
        """An earlier prompt after L1 (and, `deep`, L2) gave up what it could: restored
        from L2 or L3. `settle` before the eviction: 0 nothing, 1 every transfer ends,
        2 wanted backups start, then only the oldest transfer ends (an L3 write is then
        often in flight); `deep` always
        lets every transfer end (so L3 holds the prompt). `twice`: a
        second admission, right after the first, shares the first one's load-back, before
        that fails or is cancelled below (then the second loads the nodes itself,
        spec/restore.md); `abort_first`: the first is
        aborted while its restore is in flight; `aim`: the restore's newest transfer
        (an S2H when `deep`) fails that way -- a fault aimed at one op (not with
        `abort_first`, whose restore is cancelled in flight)."""
        self._count("resubmit")
        tokens = self._earlier(pick)
        if settle == 1 or deep:
            self.cache.drain()  # backups land first, so eviction gives up only copies
        elif settle == 2:
            self.tick(0)  # wanted backups start
            self.tick(1)
        self._give_up_upper_tiers(deep)
        first = self._admit(tokens)
        second = self._admit(tokens) if twice else None
        # Read after the second admission: across ranks it carries C4 (C1a), which may have
        # ended the first's op; a sharer issues none of its own, so the newest is the first's.
        ops = self.cache.pending_ops()
        if aim is not None and ops and not abort_first:
            self.cache.fail(ops[-1], aim)
            self.cache.tick()
        if abort_first and first in self.model.requests:
            self._end(first)
        if second is not None:
            self._serve(second, finish=False)
        if not abort_first:
            self._serve(first, finish=False)

    def _give_up_upper_tiers(self, deep: bool) -> None:
        """Evict what L1 (and, `deep`, L2) can give up, so an earlier prompt restores."""
        for tier in self.cache.tiers[: 2 if deep else 1]:
            if tier != self.cache.tiers[-1] or len(self.cache.tiers) == 1:
                self._sync()
                self.cache.evict(tier, EVERYTHING)
                self._sync(evict_want=EVERYTHING)
                if deep:
                    self.cache.drain()  # write-back's copies of L1 reach L3 too
        self._sync()

    def _earlier(self, pick: int) -> tuple[int, ...]:
        """An earlier prompt the cache holds a page of (any earlier one when none): an
        even `pick` prefers one whose backup into the last tier is in flight (a page
        PENDING there), so that its restore races the backup."""
        racing = [t for t in self.seen if self.model.pending_in(self.cache.tiers[-1], t)]
        if racing and pick % 2 == 0:
            return racing[-1 - pick // 2 % len(racing)]
        held = [t for t in self.seen if self.model.holds_any(t)] or self.seen
        return held[-1 - pick % len(held)]

    @precondition(
        lambda self: (
            len(self.model.requests) < LIVE_MAX - 1
            and bool(self.seen)
            and self.steps - self.last_cancel >= QUIET_STEPS
        )
    )
    @rule(pick=st.integers(0, 7), deep=st.booleans(), sharer=st.booleans(), own=st.booleans())
    @survives_crash
    def cancel_restore(self, pick: int, deep: bool, sharer: bool, own: bool) -> None:
        """An earlier prompt is restored as in `resubmit`, and while the restore is in
        flight the request gives it up and stays: it is served at once (what L1
        published, the rest computed). `sharer`: a second admission shares the first's
        load-back and gives up instead (the first's goes on, then it is served). `own`: the
        prompt is one of its own, served twice (backed up under every write policy) and
        drained first, so that L1 can give it up whole and a restore is in flight when it
        is given up (an earlier prompt is often still in L1, held by a live request, or in
        no lower tier, and then there is nothing to give up)."""
        self._count("cancel_restore")
        self.last_cancel = self.steps
        if own:
            tokens = l3_prompt(4 + pick % 4, 2 + pick // 4, self.cache.page_size)
            for _ in range(2):
                self.submit(tokens, 2)
        else:
            tokens = self._earlier(pick)
        self.cache.drain()
        self._give_up_upper_tiers(deep)
        first = self._admit(tokens)
        rid = self._admit(tokens) if sharer else first
        self.cache.cancel_restore(rid)
        self._sync()
        # Verify the engine no longer waits for anything on the request's behalf.
        assert self.cache.ready(rid), f"request {rid} is not ready after cancel_restore"
        self._prefill(rid)
        if sharer:
            self._serve(first, finish=False)

    @precondition(
        lambda self: (
            len(self.model.requests) < LIVE_MAX - 1
            and self.steps - self.last_l3_restore >= QUIET_STEPS // 2
        )
    )
    @rule(
        base=st.integers(0, 3),
        pages=st.integers(2, 5),
        aim=_drawn(lambda m: _aims_of_a_read(tuple(m.aims))),
    )
    @survives_crash
    def restore_from_l3(self, base: int, pages: int, aim: str | None) -> None:
        """A prompt of `pages` pages nobody else starts with: its first page served first
        (so the prompt is two nodes, and a read stopping part way may stop between
        them), then the prompt served to the end three times (each node matched twice:
        write_through_selective backs both up too), then drained. L1 and L2 give it up
        (a write-back copy reaches L3 on the way); then it is admitted again, so it is
        restored from L3: an S2H (meeting `aim`, a fault aimed at the next transfer into
        L2, or none; the aims only a read meets drawn twice as often) and a load-back;
        then served. The other rules restore from L3 only when an earlier prompt happens
        to be held there alone. Prompts of 4-5 pages make load-backs long enough for a
        mixed route (two single-page runs staged beside a longer run by its own DMA),
        which the bundle prompts' load-backs (1-3 pages) never are."""
        self._count("restore_from_l3")
        self.last_l3_restore = self.steps
        ps = self.cache.page_size
        tokens = l3_prompt(base, pages, ps)
        for prompt in (tokens[:ps] + (base,), tokens, tokens, tokens):
            self.submit(prompt, 2)
        self.cache.drain()
        self._give_up_upper_tiers(True)
        if aim is not None:
            self.cache.aim(aim, self.cache.tiers[1 % len(self.cache.tiers)])
        rid = self._admit(tokens)
        self._serve(rid, finish=False)

    @precondition(
        lambda self: (
            not self.model.requests
            and bool(self.seen)
            and self.steps - self.last_cancel >= QUIET_STEPS
        )
    )
    @rule(pick=st.integers(0, 7))
    @survives_crash
    def failed_restore_then_full_l1(self, pick: int) -> None:
        """A load-back fails (aimed) and its request waits; a second request loads the
        same prompt and ends, leaving it in L1, nobody's; other prompts fill L1 with
        locked pages; then the first is served: what it serves from L1 must survive
        the room it makes (an order the other rules reach only in long runs)."""
        self._count("failed_restore_then_full_l1")
        self.last_cancel = self.steps
        tokens = self._earlier(pick)
        self.cache.drain()
        self._give_up_upper_tiers(False)
        self.cache.aim("error", self.cache.tiers[0])
        first = self._admit(tokens)
        self.tick(1)  # the aimed load-back fails: the first is ready, with nothing restored
        self.submit(tokens, 2)
        ps = self.cache.page_size
        for other in reversed(self.seen):
            if len(self.model.requests) < LIVE_MAX and other[:ps] != tokens[:ps]:
                self.submit(other, 1)
        if first in self.model.requests and first not in self.prefilled:
            self._serve(first, finish=False)

    # -- transfers: their ends, in any order ------------------------------------------------

    @precondition(lambda self: self.cache.has_work())
    @rule(finish=st.integers(0, 2))
    @survives_crash
    def tick(self, finish: int) -> None:
        """A decode step: the `finish` oldest transfers end (per the schedule), then the
        engine observes what ended."""
        self._count("tick")
        for op_id in self.cache.pending_ops()[:finish]:
            self.cache.complete(op_id)
        self.cache.tick()

    @precondition(lambda self: bool(self.cache.pending_ops()))
    @rule(pick=st.integers(0, 7))
    @survives_crash
    def complete(self, pick: int) -> None:
        self._count("complete")
        ops = self.cache.pending_ops()  # R58: any pending op may complete next
        self.cache.complete(ops[pick % len(ops)])
        self.cache.tick()

    @precondition(lambda self: bool(self.cache.pending_ops()))
    @rule(pick=st.integers(0, 7), kind=st.sampled_from(FAIL_KINDS))
    @survives_crash
    def fail(self, pick: int, kind: str) -> None:
        self._count("fail")
        ops = self.cache.pending_ops()
        self.cache.fail(ops[pick % len(ops)], kind)
        self.cache.tick()

    @precondition(lambda self: bool(self.cache.pending_ops()))
    @rule()
    @survives_crash
    def drain(self) -> None:
        self._count("drain")
        self.cache.drain()

    # -- faults: a schedule, or one aimed at the next transfer ------------------------------

    @precondition(lambda self: self.steps - self.last_faults >= QUIET_STEPS)
    @rule(schedule=schedules())
    def faults(self, schedule: FaultSchedule) -> None:
        self._count("faults")
        self.cache.set_faults(schedule)
        self.last_faults = self.steps

    @precondition(lambda self: len(self.model.requests) < LIVE_MAX - 1 and bool(self.seen))
    @rule(
        action=_drawn(lambda m: _sampled(tuple(m.aims))),
        tier=st.integers(0, 2),
        pick=st.integers(0, 7),
    )
    @survives_crash
    def aimed(self, action: str, tier: int, pick: int) -> None:
        """A fault aimed at the next transfer into a tier (`CacheUnderTest.aim`), then a
        resubmit that issues one: into L1 a load-back from L2 (racing an L3 backup when
        one is in flight), into L2 a read from L3 (twice: the second admission computes
        while the read is in flight), into L3 the backup of what it serves."""
        self._count("aimed")
        into = self.cache.tiers[tier % len(self.cache.tiers)]
        self.cache.aim(action, into)
        level = tier % len(self.cache.tiers)
        if level == 0:  # backups start and the oldest ends (its L3 write starts), then a
            self.tick(0)  # prompt racing its L3 backup is preferred (an even pick)
            self.tick(1)
            pick -= pick % 2
        # L2: every transfer ends first (L3 holds the prompt); L3: none
        self.resubmit(
            pick=pick,
            twice=level == 1,
            deep=level == 1,
            settle=(0, 1, 0)[level],
            abort_first=False,
            aim=None,
        )

    # -- pressure: eviction on a tier -------------------------------------------------------

    def _holding(self) -> list[str]:
        """The tiers holding a page no live request's prompt begins with (pressure
        elsewhere would change nothing)."""
        return [t for t in self.cache.tiers if self.model.unclaimed(t)]

    @precondition(lambda self: bool(self._holding()))
    @rule(tier=st.integers(0, 2), pages=st.integers(1, 8))
    @survives_crash  # write-back: an L1 victim's backup is waited for, and may crash
    def pressure(self, tier: int, pages: int) -> None:
        self._count("pressure")
        holding = self._holding()
        self._sync()
        self.cache.evict(holding[tier % len(holding)], pages)
        self._sync(evict_want=pages)

    # -- storage damage and restarts --------------------------------------------------------

    @precondition(lambda self: not self.damaged and self.admitted >= DAMAGE_AFTER)
    @rule(how=st.sampled_from(("truncate", "remove")))
    @survives_crash
    def damage(self, how: str) -> None:
        """The L3 file is cut or removed; then a resubmit restoring from L3, so the
        failed read (or the refused issue) falls back to recomputation at once."""
        self._count("damage")
        self._sync()
        self.cache.damage_storage(how)
        self.damaged = True
        if self.seen and len(self.model.requests) < LIVE_MAX - 1:
            self.resubmit(pick=0, twice=False, deep=True, settle=1, abort_first=False, aim=None)

    @precondition(
        lambda self: (
            self.steps - self.last_restart >= 2 * QUIET_STEPS
            and (bool(self.model.requests) or any(self.model.pages.values()))
        )
    )
    @rule()
    def restart(self) -> None:
        self._count("restart")
        self._reopen("restart")
        self.last_restart = self.steps

    def _verify_dead(self) -> None:
        """A crashed engine that lives on (`refuses_when_dead`) refuses every call but close,
        each with no page change (R57; protocol.py): the crashed step's own changes go first,
        as `_reopen` drops them."""
        if not getattr(self.cache, "refuses_when_dead", False):
            return
        self.cache.changes()
        live = sorted(self.model.requests)
        rid = live[0] if live else self.next_rid
        prompt = self.seen[-1] if self.seen else (1, 2, 3, 4, 5)
        calls: list[tuple[str, Callable[[], object]]] = [
            ("submit", lambda: self.cache.submit(self.next_rid, prompt)),
            ("ready", lambda: self.cache.ready(rid)),
            ("prefill", lambda: self.cache.prefill(rid)),
            ("cancel_restore", lambda: self.cache.cancel_restore(rid)),
            ("finish", lambda: self.cache.finish(rid)),
            ("evict", lambda: self.cache.evict(self.model.tiers[0], 1)),
            ("tick", self.cache.tick),
        ]
        for what, call in calls:
            verify_refused(self.cache, f"{what} after a crash", call, dead=True)

    def _reopen(self, why: str) -> None:
        """Close and open the engine again (`why`: a restart, or after a crash): it
        starts empty, and so does the model."""
        if why == "crash":
            self._count("crash")
        self.cache.restart()
        self.cache.changes()  # the closed engine's last changes: everything goes anyway
        self.model.restart()
        self.prefilled.clear()
        self.admitted, self.damaged = 0, False

    # -- after every step -------------------------------------------------------------------

    def _count(self, name: str) -> None:
        if self.coverage is not None:
            self.coverage.rules[name] += 1

    def _sync(self, evict_want: int | None = None) -> None:
        """The engine's page changes since the last sync into the model (`evict_want`:
        they are one `evict` call's, which asked for that many pages)."""
        self.model.apply(self.cache.changes(), evict_want)

    @invariant()
    def agrees_with_reference(self) -> None:
        if not hasattr(self, "cache"):
            return
        found = self.cache.check()
        assert not found, "engine checks failed:\n  " + "\n  ".join(found)
        self._sync()
        self.steps += 1
        if self.coverage is not None:
            self.coverage.steps += 1
        live = self.cache.live()
        self.model.compare(live, {rid: self.cache.cached_len(rid) for rid in live})


def make_machine(
    adapter: AdapterFactory,
    setups: st.SearchStrategy[Any],
    *,
    page_size: int = 4,
    coverage: Coverage | None = None,
    name: str = "CacheMachine",
    aims: Sequence[str] = AIMS,
    refusals: bool = True,
) -> type[CacheMachine]:
    """A subclass of `CacheMachine` named `name`, driving `adapter(setup)` (one `setup` drawn
    from `setups` per run) with these parameters (CacheMachine's docstring says each)."""
    params = {
        "adapter": staticmethod(adapter),
        "setups": setups,
        "page_size": page_size,
        "coverage": coverage,
        "aims": tuple(aims),
        "refusals": refusals,
        "__module__": CacheMachine.__module__,
        "__qualname__": name,
    }
    return type(name, (CacheMachine,), params)
