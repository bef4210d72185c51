"""The hicache controller as a `CacheUnderTest`: the first adapter, on three planes.

    plane   data plane                               completions
    ------  ---------------------------------------  -------------------------------------------
    null    FaultyNullEngine (no bytes, no torch     when the machine says (`complete`/`fail`),
            work; nullengine.py)                     each per the fault schedule
    cpu     TransferEngine on the CPU, a real L3     when the hardware is done; `complete`
            file (CI)                                waits for that op, every tick first waits
                                                     for the L3 I/O already issued, so a seed
                                                     replays the same schedule
    cuda    TransferEngine on CUDA (real streams);   as cpu
            a TP rank on its own GPU when there is
            one per rank, else all on the current one

Page changes come from the controller's trace (spec/trace.md): each lifecycle event on a tree
node becomes one `PageChange` per page of the node, in the event's tier. A node is known by
the token prefix ending where it ends (an insert names its request, whose tokens the adapter
knows; a split hands the upper part the shorter prefix), so nothing is read from the tree.

`check()` adds the adapter's own finding to the controller's invariants: `decision unplanned`,
an admission whose policy chose a restore (L2 or L3) that its plan does not make and no
counted fallback explains -- a decision the log would settle against what did not happen
(the outside fuzzer's find of issue 30: an L2 choice over a freed window, nothing restored).
"""

from __future__ import annotations

import functools
import itertools
import os
import tempfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from hicache.choices import (
    EnumField,
    HitPolicy,
    LoadBackOverlap,
    RestorePolicy,
    TransferRoute,
    WritePolicy,
    check,
)
from hicache.controller.config import BACKENDS, WRITE_POLICIES, CacheConfig
from hicache.controller.controller import CacheController
from hicache.core.lifecycle import ABSENT, RESIDENT, Lifecycle, load_lifecycle
from hicache.core.pages import Pages, Placement, half_spread, spread
from hicache.core.tiers import TIERS, Direction, Tier
from hicache.core.trace import TraceEvent, TraceHeader, Tracer
from hicache.dataplane.faults import (
    ALLOC_SITES,
    READ_ACTIONS,
    Action,
    FaultInjector,
    FaultSite,
    SimulatedCrash,
)
from hicache.dataplane.null import StoppedEarly
from hicache.distributed.collectives import Collectives
from hicache.distributed.devices import rank_device
from hicache.errors import ConfigError, CorruptSlot, OutOfPages, TransferError, UnreadableSlot
from hicache.pools.hits import GROUP_HIT_POLICIES
from hicache.pools.presets import SINGLE_POOL, TINY, group, names
from hicache.pools.tierpools import window_pools
from hicache.testing.adapters.nullengine import FaultyNullEngine, FaultyNullHandle
from hicache.testing.draws import PREFIX_PAGES, SUFFIX_PAGES_MAX
from hicache.testing.knobs import interpreter_off, interpreter_on, needs_interpreter
from hicache.testing.liveness import Liveness, ObservedSink
from hicache.testing.protocol import (
    PENDING,
    WINDOW_FREED,
    WINDOW_REVIVED,
    Admission,
    FaultSchedule,
    PageChange,
)

if TYPE_CHECKING:
    from hypothesis import strategies as st

PLANES = ("null", "cpu", "cuda")
INTO = {"L1": Direction.H2D, "L2": Direction.S2H, "L3": Direction.H2S}
"""`aim`: the transfer into each tier that an aimed fault strikes (L2: a restore's read)."""
AIM_ACTIONS: dict[str, Action] = {
    "refuse": "alloc",
    "crash": "crash",
    "error": "fail",
    "corrupt": "corrupt",
    "unreadable": "short_read",
    "partial": "partial",
}
"""`aim`'s actions as `FaultInjector.aim`'s (corrupt, unreadable, partial: reads only, else
fail)."""


PARTIAL_RATE = 0.25
"""A pool group's runs: the rate of S2H_PARTIAL under every schedule (`set_faults`)."""


@dataclass(frozen=True)
class Setup:
    """What the machine draws for one run: tier sizes (pages), policies, and the plane."""

    l1_pages: int = 10
    l2_pages: int = 8
    l3_slots: int = 12
    write_policy: EnumField[WritePolicy] = EnumField(WritePolicy.WRITE_THROUGH)
    policy: EnumField[RestorePolicy] = EnumField(RestorePolicy.ALWAYS)
    promotion: bool = True
    plane: str = "null"
    check_mode: str = "every"
    # CacheConfig.load_back_overlap: share, or back off
    load_back_overlap: EnumField[LoadBackOverlap] = EnumField(LoadBackOverlap.SHARE)
    pools: str = SINGLE_POOL  # the tiers' pool group preset (null plane only for a group)
    hit_policy: EnumField[HitPolicy] = EnumField(HitPolicy.ALL_POOLS)  # a group's
    l1_window_pages: int | None = None  # CacheConfig.l1_window_pages: fewer frees L1 windows
    # The knobs below are drawn since issue 31 (hicache/testing/knobs.py); each default is
    # what the adapter used before, so a Setup built by hand runs as it did.
    backend: str | None = None  # CacheConfig.backend; None: torch, on the cuda plane auto
    prefetch: bool = True  # CacheConfig.prefetch: False, admit blocks until restored
    verify: bool = True  # CacheConfig.verify (a plane with bytes)
    layerwise: bool = False  # CacheConfig.layerwise (a single pool with bytes)
    io_threads: int | None = None  # CacheConfig.io_threads; None: 2, a group's 0
    rank_check_every: int = 0  # CacheConfig.rank_check_every (TP ranks)
    # CacheConfig.transfer_route (a plane with bytes; `pitched` a single pool's)
    transfer_route: EnumField[TransferRoute] = EnumField(TransferRoute.AUTO)
    chunk_pages: int | None = None  # CacheConfig.chunk_pages (a single pool with bytes)
    placement: str = "best_fit"  # which pages a reservation takes (PLACEMENTS)
    # the single pool's runs of L2 pages moved by their own DMA, from this many pages
    # (DIRECT_RUNS; None: the mover's DIRECT_MIN_BYTES, above every run of the machine's)
    direct_min_pages: int | None = None

    def __post_init__(self) -> None:
        # The policies' strings become their enums as they are set; a bad one: ConfigError.
        check(self, "write_policy", "policy", "load_back_overlap", "hit_policy", "transfer_route")

    @property
    def kernels(self) -> str:
        """The backend the configuration asks for (`backend`, or the plane's default)."""
        return self.backend or ("auto" if self.plane == "cuda" else "torch")

    @property
    def route(self) -> TransferRoute:
        """The transfer route the configuration asks for: `transfer_route`, but `dma` for a
        mapped route with torch's kernels on the cuda plane (a GPU's mapped copy is a Triton
        kernel: CacheConfig refuses the pair, and a TP rank's kernels are drawn apart), and
        with Triton's kernels on the cpu plane where Triton's interpreter cannot run the
        mapped kernel (`interpreted_mapped`: the mover would refuse the route by name)."""
        if self.transfer_route is not TransferRoute.MAPPED:
            return self.transfer_route
        if (self.plane, self.kernels) == ("cuda", "torch"):
            return TransferRoute.DMA
        if (self.plane, self.kernels) == ("cpu", "triton") and interpreted_mapped():
            return TransferRoute.DMA
        return self.transfer_route

    @property
    def l1_prompt_pages(self) -> int:
        """The most pages one prompt may take (its partial last page too): every L1 page, or
        fewer when L1 holds fewer windows (spec/config.md, `l1_window_pages`). Worked out here
        from the drawn sizes, not asked of the engine: the machine's refusal check."""
        return min(self.l1_pages, self.l1_window_pages or self.l1_pages)


@functools.cache
def interpreted_mapped() -> str:
    """Why Triton's interpreter cannot run the mapped kernel here ("" when it can): its probe
    (kernels/triton_mapped.probe) on one tiny CPU page, once per process. The kernel's
    interpreted branch runs on Triton 3.6's interpreter too (a `while` where a runtime loop
    bound reaches numpy as a one-element array), so this names an interpreter it meets
    later."""
    try:
        import torch  # noqa: F401  # the pools below need it
    except ImportError:  # no plane with bytes runs here
        return "torch is not installed"
    from hicache.dataplane.geometry import preset
    from hicache.dataplane.pools import DevicePool, HostPool
    from hicache.errors import BackendError
    from hicache.kernels.select import load_mapped

    l1, scratch = DevicePool(preset("tiny"), 1, "cpu"), HostPool(preset("tiny"), 1, pin=False)
    interpreter_on()
    try:
        failed: str = load_mapped().probe(l1.tensor, scratch.tensor)
        return failed
    except BackendError as e:  # Triton not importable
        return str(e)
    finally:
        interpreter_off()


POISON_BYTES = (0x5A, 0x3C, 0xC3)
"""What `_poison_reserved` fills a reserved page with, in turn (none is UNLANDED_BYTE, so a
dump tells a poisoned page from one a stopped read left)."""

WINDOW_EVENTS = {"tombstone": WINDOW_FREED, "revive": WINDOW_REVIVED}
"""Trace events of a node's L1 window, and the page change each makes of its pages."""


class ControllerAdapter:
    """`CacheController` driven through the `CacheUnderTest` protocol."""

    tiers = tuple(str(t) for t in TIERS)
    refuses_when_dead = True  # a crashed controller refuses all but close (R57)

    def __init__(self, setup: Setup, collectives: Collectives | None = None) -> None:
        """`collectives`: this adapter is one rank of a tensor-parallel cache (tp.py builds
        one per rank, each in its rank's thread: the controller's C0 runs here)."""
        if setup.plane not in PLANES:
            raise ValueError(f"plane {setup.plane!r}: one of {', '.join(PLANES)}")
        self.setup = setup
        self.collectives = collectives
        rank = 0 if collectives is None else collectives.rank
        self.lifecycle: Lifecycle = load_lifecycle()
        self.sink = ObservedSink()
        self.events: list[TraceEvent] = []  # every event of every controller this adapter built
        # Seeded by the setup, so runs differ in what they draw before their first schedule
        # (a pool group's landing reports; a single pool draws nothing then).
        self.faults = FaultInjector(seed=zlib.crc32(repr(setup).encode()) + rank, delay_polls=1)
        if setup.pools != SINGLE_POOL:
            self.faults.rates[FaultSite.S2H_PARTIAL] = PARTIAL_RATE  # F11, F12 (`set_faults`)
        self.tokens: dict[int, tuple[int, ...]] = {}
        self.findings: list[str] = []  # the adapter's own (`check`), its probes' (liveness)
        self.dir: tempfile.TemporaryDirectory[str] | None = None
        # Triton on a CPU runs in its interpreter, which Triton reads from the environment.
        self.interpreted = needs_interpreter(setup.kernels, self._device())
        if self.interpreted:
            interpreter_on()
        try:
            self.ctl = self._build()
        except BaseException:
            self._interpreter_off()
            raise
        self.page_size = self.ctl.config.kv.page_size
        assert self.page_size == PAGE_TOKENS, "the machine's prompts are PAGE_TOKENS-token pages"
        self.hit_window = self.ctl.cp.windows.hit_pages  # the protocol's (0: no windows)
        self.replay_window = self.ctl.cp.windows.replay_pages  # anchor_recompute_swa's

    def _device(self) -> str | None:
        """The CPU, or on the cuda plane CUDA: a rank of a TP cache its own GPU when there is
        one per rank (`rank_device`), else every rank on the current one."""
        if self.setup.plane != "cuda":
            return "cpu"
        if self.collectives is None:
            return "cuda"
        return rank_device("cuda", self.collectives.rank, self.collectives.size)

    def _build(self) -> CacheController:
        s = self.setup
        l3_path = None
        if s.plane != "null" and s.pools == SINGLE_POOL:  # a group's L3: temporary files
            if self.dir is None:
                self.dir = tempfile.TemporaryDirectory(prefix="hicache-fuzz-")
            l3_path = os.path.join(self.dir.name, "l3.slots")
        cfg = cache_config(s, self._device(), l3_path)
        self.sink = ObservedSink()
        self._seen = 0  # events of `sink` already turned into page changes
        self.nodes: dict[int, list[Any]] = {}  # node id -> [start token, end prefix]
        engine = None
        if s.plane == "null":
            g = cfg.kv
            engine = FaultyNullEngine(g, cfg.l1_pages, cfg.l2_pages, cfg.l3_slots, self.faults)
        ctl = CacheController(
            cfg,
            faults=self.faults,
            tracer=Tracer(self.sink),
            engine=engine,
            collectives=self.collectives,
        )
        self._fail_pools(ctl)
        self._poison_reserved(ctl)
        self._place(ctl)
        self._direct_runs(ctl)
        # Liveness, durability, efficiency (hicache/testing/liveness): one rank's probes.
        self.liveness = Liveness(ctl, s, self.sink, self.findings, self.collectives is not None)
        return ctl

    def _poison_reserved(self, ctl: CacheController) -> None:
        """On a plane with bytes, every L1 and L2 page a reservation takes (each pool's) is
        filled with a byte that changes at each reservation, as a memory sanitizer fills
        what is allocated: a page published before its bytes arrived then holds bytes no
        copy holds (I4, the served digests and the restore's verification see them), where
        the bytes its last owner left -- often the same node's, freed and taken again in one
        step -- would pass. The null plane holds no bytes."""
        if not ctl.engine.has_bytes:
            return
        plane, values = ctl.byte_plane, itertools.cycle(POISON_BYTES)

        def poison(tier: Tier, pool: str) -> Callable[[Pages], None]:
            return lambda ids: plane.scribble(tier, {pool: ids}, next(values))

        for tier in (Tier.L1, Tier.L2):
            table = ctl.cp.tables[list(Tier).index(tier)]
            for pool, t in table.pool_tables().items():
                t.on_reserve = poison(tier, pool)

    def _place(self, ctl: CacheController) -> None:
        """Every pool table of every tier reserves by the setup's placement (PLACEMENTS)."""
        placement = PLACEMENTS[self.setup.placement]
        for table in ctl.cp.tables:
            for t in table.pool_tables().values():
                t.placement = placement

    def _direct_runs(self, ctl: CacheController) -> None:
        """The single pool's mover moves runs of `direct_min_pages` L2 pages or more by their
        own DMA (DIRECT_RUNS), the shorter ones through host staging."""
        pages, engine = self.setup.direct_min_pages, ctl.engine
        if pages is None:
            return
        from hicache.dataplane.engine import TransferEngine  # torch: a plane with bytes

        if isinstance(engine, TransferEngine) and engine.one_pool:
            engine.dma.direct_min_bytes = pages * engine.dma.bytes_per_page

    def _fail_pools(self, ctl: CacheController) -> None:
        """A pool group's L2 and L3 reservations fail per pool (scenario F1: pool k of n,
        after pools 1..k-1 succeeded): the attempt of every pool but the first (in sorted
        order, the group's reservation order) draws the tier's ALLOC site; the first pool's
        failure is the controller's own ALLOC fault. L1 is left out: a prefill refused for
        room must change nothing, and its make-room eviction runs before the reservation."""
        for tier, table in zip(TIERS[1:], ctl.cp.tables[1:]):
            first, *others = table.pool_tables()  # sorted: the group's reservation order
            if others:  # a group of one: its pool is the first, the controller's own fault

                def fault(
                    pool: str, site: FaultSite = ALLOC_SITES[tier], first: str = first
                ) -> bool:
                    return pool != first and self.faults.fire(site)

                table.set_reserve_fault(fault)

    # -- requests -----------------------------------------------------------------------------

    def submit(self, request_id: int, tokens: Sequence[int]) -> Admission:
        self.tokens[request_id] = tuple(tokens)
        fallbacks = sum(self.ctl.metrics.fallbacks.values())
        with self.liveness.call("submit", request_id):
            mat = self.ctl.admit(request_id, tokens)
        d = mat.decision
        if d.choice != "recompute" and not mat.nodes:
            if sum(self.ctl.metrics.fallbacks.values()) == fallbacks:
                self.findings.append(
                    f"decision unplanned: request {request_id} chose {d.choice} ({d.reason}) "
                    f"over hits {list(mat.match.lengths)}, but its plan restores nothing and "
                    "no fallback was counted"
                )
        # Issue 31 (a drawn knob's promise): with prefetch off, `admit` returns only once its
        # restore has settled (spec/config.md), so the request is ready at once.
        if not self.setup.prefetch and not self.ctl.ready(request_id):
            self.findings.append(
                f"prefetch off: admit of request {request_id} returned before its restore "
                "settled (it must block until then)"
            )
        hits = {str(t): mat.match.lengths[i] for i, t in enumerate(TIERS)}
        return Admission(hits, self.ctl.cp.cached_len(request_id))

    def ready(self, request_id: int) -> bool:
        return self.ctl.ready(request_id)

    def prefill(self, request_id: int) -> bool:
        try:
            with self.liveness.call("prefill", request_id):
                self.ctl.prefill(request_id)
        except OutOfPages:
            return False
        self._check_private_tail(request_id)
        return True

    def _check_private_tail(self, request_id: int) -> None:
        """What `prefill` computed into the pages it keeps private (the prompt's partial last
        page, never published, so no other check reads it) is what the producer computes
        for those tokens: a KV computed on a bad prefix (a layer-wise load-back read before
        it landed, R83, or kept after it failed, R84) shows there first."""
        ctl = self.ctl
        producer, engine = ctl.producer, ctl.engine
        if producer is None or not engine.has_bytes or self.setup.pools != SINGLE_POOL:
            return
        req = ctl.cp.requests[request_id]
        n, start, ps = int(req.private_pages.size), req.private_start, self.page_size
        if not n:
            return
        padded = tuple(req.tokens) + (0,) * (start + n * ps - len(req.tokens))
        want = producer.expected(padded, start, start + n * ps)
        if want is None:
            return
        import torch  # a plane with bytes: torch is loaded

        engine_ = ctl.transfer_engine
        got = engine_.packed(Tier.L1, engine_.group.anchor.name, req.private_pages)
        if not torch.equal(got.reshape(-1), want.contiguous().view(torch.uint8).reshape(-1)):
            self.findings.append(
                f"private tail: request {request_id}'s pages {req.private_pages.tolist()} "
                f"(tokens {start}..{start + n * ps}) hold bytes its producer does not compute"
            )

    def finish(self, request_id: int) -> None:
        with self.liveness.call("finish", request_id):
            self.ctl.finish(request_id)

    def cancel_restore(self, request_id: int) -> None:
        with self.liveness.call("cancel_restore", request_id):
            self.ctl.cancel_restore(request_id)
        # spec/restore.md: the pins of what did not reach L1 go now (those that landed stay).
        pins = self.ctl.cp.requests[request_id].pins
        kept = sorted({n.node_id for n, _ in pins if not self.ctl.cp.holds(n, Tier.L1)})
        if kept:
            self.findings.append(
                f"cancel kept pins: request {request_id} still pins nodes {kept} that did not "
                "reach L1 after cancel_restore (spec/restore.md: their pins go then)"
            )

    def live(self) -> set[int]:
        return set(self.ctl.cp.requests)

    def cached_len(self, request_id: int) -> int:
        return self.ctl.cp.cached_len(request_id)

    def landing(self, request_id: int) -> tuple[int, int] | None:
        """The token range `[start, end)` of the request's own load-back that is landing
        layer by layer (`CacheConfig.layerwise`): its `prefill` applies that op's end first,
        so those pages do not cut what it serves. None when its restore is not landing."""
        mat = self.ctl.restores.get(request_id)
        found = None if mat is None or mat.done else self.ctl._landing(mat)
        return None if found is None else found[0].token_range

    def served_digests(self, request_id: int) -> list[int] | None:
        """The served L1 pages' digests; None without bytes, and for a pool group, whose
        page digest is UNSERVABLE while a trailing pool's window is freed (its restores are
        compared with the producer's bytes instead: `verify`, and I4 after every transition)."""
        if not self.ctl.engine.has_bytes or self.setup.pools != SINGLE_POOL:
            return None
        pages = self.ctl.cp.prefix_pages(self.ctl.cp.prefix_node(request_id), Tier.L1)
        ps = self.page_size
        pages = pages[: self.ctl.cp.cached_len(request_id) // ps]
        return [int(d) for d in self.ctl.transfer_engine.digests("L1", pages)]

    # -- transfers ----------------------------------------------------------------------------

    def tick(self) -> None:
        self.join_io()
        with self.liveness.call("tick"):
            self.ctl.tick()

    def has_work(self) -> bool:
        ctl = self.ctl
        return (
            bool(ctl.handles)
            or ctl.backups.pending
            or not all(m.done for m in ctl.restores.values())
        )

    def pending_ops(self) -> list[int]:
        return sorted(op for op, h in self.ctl.handles.items() if not h.status.final)

    def complete(self, op_id: int) -> None:
        handle = self.ctl.handles[op_id]
        if isinstance(handle, FaultyNullHandle):
            handle.settle(True)
        else:
            handle.wait(None)

    def fail(self, op_id: int, kind: str, landed: int = 0) -> None:
        """Op `op_id` fails with `kind` ("error", "corrupt", "unreadable"), or, on the null
        plane, "partial": an S2H stops part way, after 1 + `landed` (modulo its size less one)
        anchor pages in every backed-up pool (spec/pools.md F11; none of a one-page read);
        "partial" elsewhere is "error"."""
        handle = self.ctl.handles[op_id]
        op = self.ctl.cp.ops[op_id]
        if isinstance(handle, FaultyNullHandle) and kind == "partial":
            if op.direction is Direction.S2H:
                kept = self.ctl.group.backed_up()
                size = sum(n.num_pages for n in op.nodes)
                pages = 1 + landed % (size - 1) if size > 1 else 0
                handle.landed = {p.name: pages * kept.ratio(p.name) for p in kept.pools}
                handle.fail(StoppedEarly())
                return
            kind = "error"
        if isinstance(handle, FaultyNullHandle):
            handle.settle(False, kind)
            return
        path = self.ctl.engine.l3_path
        slot = int(op.source_pages[0])
        error = (
            {
                "corrupt": CorruptSlot(slot, path),
                "unreadable": UnreadableSlot((slot,), path, "injected"),
            }.get(kind)
            if op.direction.value == "S2H"
            else None
        )
        handle.fail(error or TransferError(f"{op.direction} failed (injected)"))

    def evict(self, tier: str, n_pages: int) -> None:
        with self.liveness.call("evict"):
            self.ctl.evict(tier, n_pages)

    def set_faults(self, schedule: FaultSchedule) -> None:
        """Every site is drawn, the controller's own included: ALLOC_L1/L2/L3 (a reservation
        refused: a fallback or a dropped backup) and CRASH_BEFORE_PUBLISH (`SimulatedCrash`
        out of the call that observed the DONE; the machine then restarts). A pool group's
        run adds S2H_PARTIAL at PARTIAL_RATE: an S2H stops with a per-pool report of what
        landed, the controller publishes its clamp (spec/pools.md F11, F12)."""
        known = {s.value for s in FaultSite}
        self.faults.rates = {
            FaultSite(k): v for k, v in schedule.rates.items() if k in known and v > 0
        }
        if self.setup.pools != SINGLE_POOL:
            # Scenarios F11, F12: a group's S2H stops part way, per pool (`landing`).
            self.faults.rates[FaultSite.S2H_PARTIAL] = PARTIAL_RATE
        self.faults.seed = schedule.seed
        self.faults.__post_init__()  # a fresh, seeded draw sequence

    def drain(self) -> None:
        """Every transfer ends (each per the schedule); ticks until nothing is in flight and
        no backup is wanted (bounded: backups of backups end after L3); then what a drain
        guarantees is checked (hicache/testing/liveness)."""
        with self.liveness.call("drain"):
            self._drain()

    def _drain(self) -> None:
        for _ in range(64):
            if not self.ctl.handles and not self.ctl.backups.pending:
                return
            for op_id in self.pending_ops():
                self.complete(op_id)
            self.tick()
        raise TransferError("drain: transfers still pending after 64 ticks")

    def aim(self, action: str, tier: str) -> None:
        """`FaultInjector.aim` at the next transfer into `tier` (INTO); "corrupt",
        "unreadable" and "partial" other than into L2 (a read of L3) are "fail". ConfigError
        for an unknown action or tier, nothing changed."""
        if action not in AIM_ACTIONS or tier not in INTO:
            raise ConfigError(
                "aim",
                f"an action of {sorted(AIM_ACTIONS)} and a tier of {sorted(INTO)}, "
                f"got {action!r}, {tier!r}",
            )
        direction = INTO[tier]
        kind = AIM_ACTIONS[action]
        if kind in READ_ACTIONS and direction is not Direction.S2H:
            kind = "fail"
        self.faults.aims.clear()  # one aim at a time: an earlier one that never met its op goes
        self.faults.aim(kind, direction=direction)

    def free_window(self, pick: int) -> tuple[int, ...] | None:
        """Free the L1 window of the `pick`-th node (modulo) whose window the controller's
        make-room could free now (`L1Windows.candidates`: unlocked, least recently used
        first), as window pressure would; the token prefix through that node, or None when
        no node qualifies (nothing changed)."""
        cp = self.ctl.cp
        found = cp.windows.candidates(cp.tree.nodes())
        if not found:
            return None
        node = found[pick % len(found)]
        cp.tombstone(node)
        return tuple(self.nodes[node.node_id][1])

    def damage_storage(self, how: str) -> None:
        """Cut the L3 file to 3 bytes or remove it (the null plane: its equivalent, see
        nullengine.py). ConfigError for another `how`, nothing changed."""
        if how not in ("truncate", "remove"):
            raise ConfigError("damage_storage", f"'truncate' or 'remove', got {how!r}")
        engine = self.ctl.engine
        if isinstance(engine, FaultyNullEngine):
            engine.damage(how)
            return
        self.join_io()  # the cut lands between transfers, the same on every replay
        plane = self.ctl.byte_plane
        if not plane.one_pool:  # a group's temporary files, no name to remove:
            for f in plane.group_storage.files.values():  # both cut every pool's file
                os.ftruncate(f.fd, 3)
            return
        l3 = plane.l3
        if how == "truncate":
            os.ftruncate(l3.fd, 3)
        elif os.path.exists(l3.path):
            os.unlink(l3.path)

    def restart(self, collectives: Collectives | None = None) -> None:
        """Close and open again (a rank of a cache whose job restarted: its new `collectives`)."""
        if collectives is not None:
            self.collectives = collectives
        self._close_controller()
        self._flush_into_events()
        self.tokens.clear()
        self.ctl = self._build()

    def _close_controller(self) -> None:
        """Close, even when the close itself observes a DONE the schedule crashes on (a
        crashed controller then only quiesces and releases)."""
        try:
            self.ctl.close()
        except SimulatedCrash:
            self.ctl.close()

    def close(self) -> None:
        """Close the controller; the interpreter and the L3 directory are given back even
        when that raises (a run that failed inside the controller), or TRITON_INTERPRET
        would stay set for every later run in the process."""
        try:
            self._close_controller()
            self._flush_into_events()
        finally:
            self._interpreter_off()
            if self.dir is not None:
                self.dir.cleanup()
                self.dir = None

    def _interpreter_off(self) -> None:
        if self.interpreted:
            self.interpreted = False
            interpreter_off()

    def join_io(self) -> None:
        """Wait for L3 I/O already issued (without polling): the schedule a seed replays.
        On the deterministic schedule (`io_threads=0`) no thread runs it: it runs here."""
        if self.ctl.engine.has_bytes:
            self.ctl.byte_plane.run_deferred()
        for handle in list(self.ctl.handles.values()):
            tasks = getattr(handle, "tasks", None)
            if tasks is not None:
                tasks.join(None)

    # -- observation --------------------------------------------------------------------------

    def control_planes(self) -> list[Any]:
        """The control plane the machine may send illegal calls (hicache/testing/illegal/):
        each is refused with nothing changed, so the controller never sees them."""
        return [self.ctl.cp]

    def check(self) -> list[str]:
        from hicache.invariants import check_all

        found = [str(v) for v in check_all(self.ctl.cp.snapshot())]
        return found + [f"tree audit: {p}" for p in self.ctl.cp.tree.audit()] + self.findings

    def trace(self) -> list[TraceEvent]:
        return self.events + self.sink.events

    def trace_header(self) -> TraceHeader:
        """The header of the current controller's trace (its control plane's)."""
        return self.ctl.cp.trace_header(engine="hicache controller (fuzz machine)")

    def fault_counts(self) -> dict[str, int]:
        return {site.value: n for site, n in self.faults.fired.items()}

    def changes(self) -> list[PageChange]:
        out: list[PageChange] = []
        for e in self.sink.events[self._seen :]:
            out.extend(self._changes_of(e))
        self._seen = len(self.sink.events)
        return out

    def _flush_into_events(self) -> None:
        self.events.extend(self.sink.events)
        self.sink.events = []
        self._seen = 0

    def _changes_of(self, e: TraceEvent) -> list[PageChange]:
        if e.event == "split":
            upper, at = e.detail.get("upper"), e.detail.get("at")
            lower = self.nodes.get(e.node or -1)
            if lower is not None and isinstance(upper, int) and isinstance(at, int):
                start, prefix = lower
                self.nodes[upper] = [start, prefix[: start + at]]
                lower[0] = start + at
            return []
        if e.event == "node_remove":
            self.nodes.pop(e.node or -1, None)
            return []
        if e.event in WINDOW_EVENTS:  # a node's L1 window freed or back: each of its pages
            start, prefix = self.nodes[e.node or -1]
            return [
                PageChange("L1", tuple(prefix[:end]), WINDOW_EVENTS[e.event])
                for end in range(start + self.page_size, len(prefix) + 1, self.page_size)
            ]
        t = self.lifecycle.transitions.get(e.event)
        if t is None or t.acts_on_copy or e.node is None or e.before is None or e.after is None:
            return []
        if e.event == "insert" and e.request is not None:
            self.nodes[e.node] = [e.token_start, self.tokens[e.request][: e.token_end]]
        known = self.nodes.get(e.node)
        if known is None or e.token_start is None or e.token_end is None:
            raise AssertionError(
                f"trace event on node {e.node} the adapter never saw created: {e.to_json()}"
            )
        prefix = known[1]
        i = TIERS.index(t.tier)
        state = self._graph_states(e.after)[i]
        state = state if state in (ABSENT, RESIDENT) else PENDING
        return [
            PageChange(str(t.tier), tuple(prefix[:end]), state)
            for end in range(e.token_start + self.page_size, e.token_end + 1, self.page_size)
        ]

    def _graph_states(self, name: str) -> tuple[str, str, str]:
        for c in self.lifecycle.composites:
            if c.name == name:
                return c.states
        raise AssertionError(f"composite state {name!r} is not in the tables")


def cache_config(s: Setup, device: str | None, l3_path: str | None) -> CacheConfig:
    """The controller's configuration for setup `s`, its L1 on `device`, its L3 at `l3_path`
    (None: a temporary file, or none on the null plane)."""
    return CacheConfig(
        l1_pages=s.l1_pages,
        l2_pages=s.l2_pages,
        l3_slots=s.l3_slots,
        device=device,
        backend=s.kernels,
        transfer_route=s.route,
        chunk_pages=s.chunk_pages,
        policy=s.policy,
        write_policy=s.write_policy,
        promotion=s.promotion,
        prefetch=s.prefetch,
        check_mode=s.check_mode,
        verify=s.verify,
        layerwise=s.layerwise,
        l3_path=l3_path,
        l3_overwrite=True,
        # A group's L3 parts run on the polling thread: the schedule a seed replays
        # (`join_io` waits for a single pool's threads).
        io_threads=(2 if s.pools == SINGLE_POOL else 0) if s.io_threads is None else s.io_threads,
        load_back_overlap=s.load_back_overlap,
        pools=s.pools,
        hit_policy=s.hit_policy,
        l1_window_pages=s.l1_window_pages,
        rank_check_every=s.rank_check_every,
    )


def controller_adapter(setup: Setup) -> ControllerAdapter:
    """The factory the machine calls (a `Setup` -> an adapter)."""
    return ControllerAdapter(setup)


PAGE_TOKENS = 4
"""Tokens per page of the machine's prompts (`make_machine`'s page_size) and of the
controller's default geometry, which the adapter builds."""


def fuzz_presets() -> tuple[str, ...]:
    """The pool presets the machine can drive: the single pool, and every group whose anchor
    pages are PAGE_TOKENS tokens (the `-tiny` variants; a full-size preset's are 64 or 256)."""
    return tuple(n for n in names() if n == SINGLE_POOL or group(n).anchor.page_size == PAGE_TOKENS)


def check_preset(pools: str) -> None:
    """ConfigError unless the machine can drive `pools` (`fuzz_presets`), saying which can."""
    anchor = group(pools).anchor.page_size  # ConfigError: no such preset
    if pools not in fuzz_presets():
        tiny = f"; {pools}{TINY} has its structure" if pools + TINY in names() else ""
        raise ConfigError(
            "pools",
            f"{pools!r} has {anchor}-token anchor pages and the fuzz "
            f"machine's prompts {PAGE_TOKENS}-token pages: choose one of "
            f"{list(fuzz_presets())}{tiny}",
        )


RESTORE_POLICIES = (
    (RestorePolicy.ALWAYS,) * 5 + (RestorePolicy.NEVER,) * 2 + (RestorePolicy.THRESHOLD,)
)
"""The restore policies `setups` draws, `always` most often: the new knobs' values (threshold,
prefetch off, back_off) are drawn rarely enough that the restore-heavy runs the rules are
written for stay common (with each a third of the runs, no S2H was ever cancelled in 12,000
single-pool steps: tests/test_testing_coverage.py)."""


PLACEMENTS: dict[str, Placement | None] = {
    "best_fit": None,
    "spread": spread,
    "half_spread": half_spread,
}
"""Which free pages a reservation takes (`PageTable.placement`), drawn by `setups` on the
planes with bytes (the null plane keeps best fit: it moves no bytes): the reference's best
fit, which finds one run of pages where there is one, so that the
machine's transfers were one run of L2 pages nearly always (none fragmented in 1,000 cpu-plane
steps of seed 1); or `spread`, every reservation as many runs as the free pages allow -- what
an engine's free list gives after long churn: the data plane's fragmented routes (pages
sorted into runs, host staging, mapped and pitched in any order) and L3 I/O over scattered
slots run under the machine's cancels and faults; or `half_spread`, half a reservation one
run and the rest apart, whose transfers mix long runs and single pages (with DIRECT_RUNS'
2: some runs by their own DMA, some staged). The oracle maps pages by reservation, so every
placement is judged alike."""

CHUNKINGS = (None, None, 1, 2, 3)
"""The `chunk_pages` `setups` draws on a single pool with bytes: the reference's schedule (one
chunk at the machine's sizes) as often as fixed chunks of 1, 2 or 3 pages, which put chunk
k+1's DMA beside chunk k's gather or scatter, and cancels and faults between them."""


DIRECT_RUNS: tuple[int | None, ...] = (None, 0, 2, 2)
"""The single pool's `direct_min_bytes`, in pages, `setups` draws on the planes with bytes
(`Setup.direct_min_pages`): the mover's default (256 KiB) is above every run of the
machine's tiny pages, so a fragmented transfer went all through host staging and never
*mixed* (some runs by their own DMA, some staged: staged pages first in the packed buffer for
a D2H, last for an H2D, the two kinds of copy in one chunk); 0 moves every run by its own DMA;
2 stages the runs of one page and moves the longer ones directly -- mixed wherever the
pages allow (routes.py, `plan_route`)."""


def transfer_routes(pools: str) -> tuple[TransferRoute, ...]:
    """The routes `setups` draws on a plane with bytes: every one for the single pool; a
    group's, all but `pitched` (a typed pool's alone). Off the GPU `auto` moves by DMA, so
    `mapped` and `pitched` are what runs each route's code on the CPU planes."""
    return tuple(r for r in TransferRoute if pools == SINGLE_POOL or r is not TransferRoute.PITCHED)


def setups(
    plane: str = "null",
    load_back_overlap: LoadBackOverlap | str | None = None,
    pools: str = SINGLE_POOL,
) -> st.SearchStrategy[Setup]:
    """Small, restore-heavy configurations: L1 holds one long prompt and a little more, L2
    and L3 are tight, and every knob that changes behaviour is drawn (hicache/testing/
    knobs.py says which, where, and why the rest are fixed). `load_back_overlap`: fixed to
    this value, or None to draw it. `pools`: the tiers' pool group preset (a group checks
    every transition, on the null plane too)."""
    from hypothesis import strategies as st

    check_preset(pools)
    bytes_, single = plane != "null", pools == SINGLE_POOL
    # The machine checks everything after every step; inside each transition as well on the
    # real planes and for a group (a bad byte is best caught where it lands), now and then
    # only every few transitions (the checker's periodic mode).
    usual = "off" if not bytes_ and single else "every"
    base = st.builds(
        Setup,
        l1_pages=st.integers(7, 12),
        l2_pages=st.integers(3, 12),
        l3_slots=st.integers(2, 16),
        write_policy=st.sampled_from(WRITE_POLICIES),
        policy=st.sampled_from(RESTORE_POLICIES),
        promotion=st.booleans(),
        plane=st.just(plane),
        load_back_overlap=st.sampled_from(
            (LoadBackOverlap.SHARE,) * 4 + (LoadBackOverlap.BACK_OFF,)
        )
        if load_back_overlap is None
        else st.just(load_back_overlap),
        pools=st.just(pools),
        check_mode=st.sampled_from((usual, usual, "periodic 7")),
        backend=st.sampled_from(BACKENDS) if bytes_ else st.none(),
        prefetch=st.sampled_from((True,) * 4 + (False,)),
        verify=st.sampled_from((True, True, True, False)) if bytes_ else st.just(True),
        layerwise=st.booleans() if bytes_ and single else st.just(False),
        io_threads=st.just(0) if bytes_ else st.none(),  # knobs.py: FIXED, and why
        transfer_route=st.sampled_from(transfer_routes(pools))
        if bytes_
        else st.just(TransferRoute.AUTO),
        # the machine's transfers are a few tiny pages: one chunk unless chunk_pages is set
        chunk_pages=st.sampled_from(CHUNKINGS) if bytes_ and single else st.none(),
        placement=st.sampled_from(tuple(PLACEMENTS)) if bytes_ else st.just("best_fit"),
        direct_min_pages=st.sampled_from(DIRECT_RUNS) if bytes_ and single else st.none(),
    )
    if pools == SINGLE_POOL or not window_pools(group(pools)):
        return base
    # A group with a trailing side pool: both hit policies, and an L1 that holds fewer
    # windows than pages (it frees the least recently used ones; the longest prompt still
    # fits) or one for every page.
    longest = PREFIX_PAGES + SUFFIX_PAGES_MAX + 1
    return base.flatmap(
        lambda s: st.builds(
            replace,
            st.just(s),
            hit_policy=st.sampled_from(GROUP_HIT_POLICIES),
            l1_window_pages=st.one_of(
                st.none(), st.integers(longest, max(longest, s.l1_pages - 1))
            ),
        )
    )
