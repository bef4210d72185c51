"""The bug zoo: deliberately broken variants of the reference, one per bug class.

Each mutant is a small, named patch of one real function, modelled on a class of
spec/bugclasses.md (or on a failure mode of the invariant checker itself). `activate(name)`
returns a context manager that swaps the broken version in and restores the original on exit:

    with activate("B06"):          # a split that forgets a pending op's node list
        run_the_machine()          # must fail, naming the check that caught it

Nothing else reaches these patches: no configuration field, flag or environment variable
of the cache switches one on; only `hicache fuzz --mutant NAME` and the zoo's tests call
`activate`. The tensor-parallel mutants (B16 and the TP- ones: agreement bugs of the
F15-F18 scenarios in spec/tp.md) run on the TP machines.

    name         class  patched function                          what is broken
    -----------  -----  ----------------------------------------  ----------------------------
    B01          B01    ControlPlane.advance_cached_len           serves before publication
    B02          B02    ControlPlane.fail                         frees the published L2 source
    B03          B03    ControlPlane.cancel                       leaks the target pages
    B04          B04    ControlPlane.issue                        never locks the source
    B05          B05    DeviceHostMover.d2h                       reads a stale index buffer
    B06          B06    ControlPlane._on_split                    op forgets the upper half
    B07          B07    execute._Context.parent_resident          issue guard always passes
    B07-leaf     B07    HiRadixTree._refresh_leaf                 leaf set keyed on L1's children
    B08          B08    HiRadixTree.split                         cuts values by tokens
    B09          B09    GroupTable._rollback                      a failed group reserve keeps
                                                                  the pools it took
    B10          B10    TierPools.free                            an L2 eviction frees the
                                                                  anchor, not the side pools
    B11          B11    HiRadixTree.unlock                        clamps at zero
    B12          B12    RestoreStager._settle_own                 a failed load raises
    B13          B13    storage_io.coalesce                       merges on one side
    B14          B14    StorageMover._move_all                    short I/O taken as complete
    B15          B15    TransferEngine.h2d                        scatters to the wrong pages
    B16          B16    ledger.writes_pool                        the L3 write rule inverted
    B16-ack      B16    L3Writes.writes_any                       ranks other than 0 ack L3
                                                                  backups they should write
    TP-conditional  -   Agreement.completion                      skips C4 with nothing to say
    TP-local-capacity - Transfers._issue_here                     evicts and retries alone
    TP-min-of-maxima -  Agreement.admit                           the L1 hit is the least of
                                                                  the ranks' own hits
    TP-rank-local-bytes GroupSyntheticProducer.pool_bytes         a replicated pool's bytes
                                                                  differ on ranks but 0
    TP-cancel-ended  -  Transfers.settle                          C5 before its fix: a cancel
                                                                  publishes on one rank
    TP-moving-landed -  Agreement.completion                      C4 before its fix: a rank
                                                                  still moving counts all landed
    F11-no-clamp -      transfers.clamped_nodes                   a stopped S2H publishes
                                                                  every node it read
    decision-unplanned  RankAgreement.policy_hits                 a restore chosen that no
                                                                  plan makes (a freed window)
    replay-unrevived -  L1Windows.clip                            a replayed window counted,
                                                                  never recomputed nor revived
    L3-no-lock   -      storage._lock                             a live controller's L3 file
                                                                  is taken over by a second
    T-h2d-unpinned -    lifecycle.toml h2d_* rows                 a load-back never locks (nor
                                                                  unlocks) its L2 source
    T-h2d-fail-publishes - lifecycle.toml h2d_fail                a failed load-back publishes
                                                                  the L1 pages it was filling
    T-h2s-keeps-lock -  lifecycle.toml h2s_complete               a finished L3 backup keeps
                                                                  its L2 source locked
    T-s2h-locks-l1 -    lifecycle.toml s2h_issue                  a promotion locks L1, not
                                                                  its L3 source
    guard-chain-head -  Executor.plan                             a row checked on a chain's
                                                                  first node only
    guard-chain-tail -  Executor.plan                             a row checked on a chain's
                                                                  last node only
    parent-guard-grandparent  execute._Context.parent_resident    the issue guard reads the
                                                                  node's grandparent
    chain-deepest-first control.pairwise (issue)                  a chain listed deepest first
                                                                  issued unreversed
    advance-locks-first ControlPlane.advance_cached_len           a refused advance leaks the
                                                                  lock it took first
    tombstone-locked -  ControlPlane.tombstone                    frees a window locked in L1
    LV-l3-head-only -   Transfers.settle                          a D2H wants its chain's first
                                                                  node in L3: deeper never go
    LV-lru-unsorted -   HiRadixTree.candidates                    eviction in leaf order, not
                                                                  least recently used first
    LV-quarantine-forgets L3Health._bad_slots                     a bad L3 copy is forgotten,
                                                                  never dropped
    LV-writeback-parent Transfers.back_up_now                     write-back backs up the
                                                                  victim's parent: victim lost
    LV-l3-hit-min -     RankAgreement.policy_hits                 the L3 hit offered is cut at
                                                                  the L2 hit: L3 never chosen
    I1-skip-L2   -      the I1 check                              skips tier L2
    checker-off  -      InvariantChecker.after_transition         never checks
    oracle-pages-count  checktrace Comparer._pages                an eviction's or release's
                                                                  pages compared by count
    oracle-two-ids -    checktrace IdMap.match                    one node named by two ids
    oracle-no-before -  checktrace Comparer._same                 `before` never compared
    oracle-seq-repeat - checktrace TraceReader.parse              a repeated seq is replayed
    walk-no-continuity  tracewalk Walker.step                     a node's walk not followed
                                                                  from event to event
    split-rounds-up -   tree._common_pages                        a cut inside a page rounds
                                                                  up: a page split off unshared
    l3-any-checksum -   L3File.verify                             a read passes on any written
                                                                  slot's checksum
    rank-check-local-mode - CacheController.admit                 the cross-rank check follows
                                                                  a rank's own check_mode
    prefetch-off-ticks-once CacheController.admit                 prefetch off: admit returns
                                                                  before its restore settled
    triton-one-page -   triton_rows._launch                       Triton moves nothing for a
                                                                  one-page transfer
    route-mixed-overlap routes._route_small                       a D2H's direct runs over its
                                                                  staged pages (mixed route)
    route-h2d-staged-overlap routes._route_small                  an H2D's staged pages over its
                                                                  direct runs (mixed route)
    chunk-one-slot -    routes.index_slots                        every chunk's L1 indices at
                                                                  slot 0
    mapped-l1-from-l2 - DmaPlan.fill_mapped                       a mapped D2H's L1 pages read
                                                                  from its L2 page list
    pitched-short-page  dma.copy_pages                            a pitched copy moves one row
                                                                  short

One module per family: `bugclasses` (B01-B15), `tp` (B16 and agreement bugs), `found` (bugs
found from outside, put back), `tables` (wrong lifecycle tables, edited consistently: the
executor and the walk's machine both read the edited rows), `guards` (guards and refusals
the controller never crosses, caught by the fuzz machine's illegal calls:
hicache/testing/illegal/), `liveness` (the LV- ones: a cache that stays safe but does less
than the spec promises), `checker` (the invariant checker's own failure modes), `oracle`
(check-trace's own failure modes, caught by the fuzz's self-check:
hicache/testing/selfcheck.py), `reach` (paths only the fuzz's wider draws reach: a split
inside a page, a tampered L3 slot, TP ranks that differ, a knob once fixed), `routes` (the
data plane's routes, chunks and fragmented transfers, reached by the fuzz's route, chunk,
placement and direct-run draws); `base` defines
`Mutant` and `swapped`. A new mutant goes in its family's module and its `ZOO`, and in the
table above.
"""

from __future__ import annotations

import contextlib

from hicache.errors import ConfigError
from hicache.testing.mutants import (
    bugclasses,
    checker,
    found,
    guards,
    liveness,
    oracle,
    reach,
    routes,
    tables,
    tp,
)
from hicache.testing.mutants.base import Mutant

ZOO: tuple[Mutant, ...] = (
    *bugclasses.ZOO,
    *tp.ZOO,
    *found.ZOO,
    *tables.ZOO,
    *guards.ZOO,
    *liveness.ZOO,
    *checker.ZOO,
    *oracle.ZOO,
    *reach.ZOO,
    *routes.ZOO,
)
"""Every mutant, in the order `hicache fuzz --mutant list` prints them."""

MUTANTS: dict[str, str] = {m.name: m.description for m in ZOO}
"""Every mutant's name -> its one-line description (what is broken)."""

_BY_NAME: dict[str, Mutant] = {m.name: m for m in ZOO}


def get(name: str) -> Mutant:
    """The mutant called `name` (an "M-" prefix is accepted: "M-B06" is "B06"). ConfigError,
    listing the names, for an unknown one."""
    key = name[2:] if name.startswith("M-") else name
    mutant = _BY_NAME.get(key)
    if mutant is None:
        raise ConfigError("mutant", f"no mutant named {name!r}; known: {', '.join(MUTANTS)}")
    return mutant


def activate(name: str) -> contextlib.AbstractContextManager[None]:
    """A context manager that switches mutant `name` on inside its block (and off after it,
    also when the block raises). Activations do not nest: one mutant at a time."""
    return get(name).patch()
