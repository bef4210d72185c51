"""Mutants that only the fuzz machine's wider draws reach (issue 31, item 4): each breaks a
path the machine never took before it drew prompts that diverge inside a page, damaged the L3
file under the engine, gave TP ranks their own rank-local knobs, or drew a knob it used to
fix (hicache/testing/draws.py, tamper.py, knobs.py, adapters/tp.py `tp_setups`).

    name                   reached by                  what is broken
    ---------------------  --------------------------  ----------------------------------------
    split-rounds-up        a prompt diverging inside   a cut inside a node's key counts a page
                           a page (`diverged`)         shared in part as shared: the split
                                                       keeps a page whose tokens differ
    l3-any-checksum        another slot's page copied  a read is accepted when its checksum is
                           over a held slot (`tamper`  any written slot's, not its own slot's
                           copy)
    rank-check-local-mode  ranks that differ in a      the cross-rank check (a collective) runs
                           rank-local knob             on each rank's own check_mode: a rank
                           (`tp_setups`)               with checks off never makes it
    prefetch-off-ticks-once
                           prefetch=False drawn        admit ticks once, not until its restore
                                                       settles: a request not ready returned
    triton-one-page        backend triton drawn on     Triton's gather/scatter move nothing
                           the cpu plane               for one page (its probe moves two)
    layer-gate-lets-in     layerwise=True drawn        a layer-wise load-back's gate lets its
                                                       reader in before the layer landed (the
                                                       layers land only at the end): a prefill
                                                       computes on stale layers

Before those draws, two prompts always diverged on a page start (so a shared run was whole
pages, rounded either way alike), a damaged slot's bytes were never another slot's valid page
(CORRUPT_SLOT inverts one byte: no slot's checksum matches), and every TP rank had the same
configuration (a collective gated on a rank-local field was made by all ranks or none);
prefetch was always on and the cpu plane's kernels always torch (`auto` never picks Triton on
a CPU). Registered in `hicache.testing.mutants`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hicache.testing.mutants.base import Mutant, swapped


def _split_rounds_up() -> contextlib.AbstractContextManager[None]:
    """`_common_pages` counts the tokens a node's key shares with the prompt, then rounds
    up to pages (ceil for floor), clamped inside the key as a split needs: a prompt that
    diverges inside a page is matched through that page, and the node is split after it
    (the split's upper half keeps tokens the prompt does not have)."""
    import hicache.core.tree as tree

    def _common_pages(
        key: tuple[int, ...], seq: tuple[int, ...], pos: int, end: int, ps: int
    ) -> int:
        n = min(len(key), end - pos)
        common = next((i for i in range(n) if key[i] != seq[pos + i]), n)
        # A split must stay inside the key: the rounded-up count is clamped there.
        return min(-(-common // ps), len(key) // ps - 1, (end - pos) // ps)

    return swapped(tree, "_common_pages", _common_pages)


def _l3_any_checksum() -> contextlib.AbstractContextManager[None]:
    """`L3File.verify` accepts bytes whose checksum is that of any written slot (a lookup in
    the set of recorded checksums, as a dedup index would), not of the slot read: a slot
    holding another slot's valid page is served as its own."""
    from hicache.dataplane.storage import L3File

    original = L3File.__dict__["verify"]

    def verify(self: Any, slot: int, data: memoryview) -> None:
        if self._written[slot] and self.page_checksum(data) in set(
            self._crc[self._written].tolist()
        ):
            return
        original(self, slot, data)

    return swapped(L3File, "verify", verify)


def _rank_check_local_mode() -> contextlib.AbstractContextManager[None]:
    """With `rank_check_every` 0 the cross-rank check (C7-C9, a collective) follows the
    rank's own invariant checks: a rank whose check_mode is on cross-checks before every
    admission after its first (periodic N: every Nth), one with check_mode off never. Which
    collectives a rank makes then depends on a rank-local field (spec/tp.md, the SPMD rule):
    its peers wait in a collective it never makes."""
    from hicache.controller.controller import CacheController

    original = CacheController.__dict__["admit"]

    def admit(self: Any, request_id: int, tokens: Any) -> Any:
        mode = self.cp.checker.mode
        due = self.admissions and mode.due(self.admissions)
        if self.tp and not self.config.rank_check_every and due:
            self.check_ranks()
        return original(self, request_id, tokens)

    return swapped(CacheController, "admit", admit)


def _prefetch_off_ticks_once() -> contextlib.AbstractContextManager[None]:
    """With `prefetch=False`, `admit` ticks once after starting the restore (an `if` where
    the `while` belongs) instead of until it settles: it returns a request that is not ready,
    though the caller was promised one (spec/config.md, `prefetch`)."""
    from dataclasses import replace

    from hicache.controller.controller import CacheController

    original = CacheController.__dict__["admit"]

    def admit(self: Any, request_id: int, tokens: Any) -> Any:
        config = self.config
        if config.prefetch:
            return original(self, request_id, tokens)
        self.config = replace(config, prefetch=True)  # the restore started, not awaited
        try:
            mat = original(self, request_id, tokens)
        finally:
            self.config = config
        if not mat.done:
            self.tick()
        return mat

    return swapped(CacheController, "admit", admit)


def _triton_one_page() -> contextlib.AbstractContextManager[None]:
    """The Triton gather/scatter returns at once for a transfer of one page (`n <= 1` where
    `n == 0` belongs): nothing is moved. Its probe moves two pages, so the backend is
    accepted; `auto` never picks Triton on a CPU, and the torch path is right."""
    from hicache.kernels import triton_rows
    from hicache.kernels.reference import check_operands, word_view

    def _launch(
        l1: Any, pages: Any, packed: Any, *, gather: bool, config: Any, stream: Any
    ) -> None:
        layout = check_operands(l1, pages, packed, scatter=not gather)
        if layout.n <= 1:
            return
        triton_rows.launch_layout(
            layout,
            word_view(l1, layout),
            word_view(packed, layout),
            pages,
            gather=gather,
            config=config,
            stream=stream,
        )

    return swapped(triton_rows, "_launch", _launch)


def _layer_gate_lets_in() -> contextlib.AbstractContextManager[None]:
    """`wait(layer)` of a layer-wise load-back's gate returns at once: the reader reads the
    layer before it landed (on a GPU: a stream wait on the wrong event, or none). Every layer
    still lands at the end and the op ends DONE, so each restored page is right; what is
    wrong is the KV the prefill computed on the stale layers (spec/restore.md, R83)."""
    from hicache.dataplane.layerwise import _PerLayerGate

    def wait(self: Any, layer: int) -> None:
        self.landed_layers = max(self.landed_layers, layer + 1)

    return swapped(_PerLayerGate, "wait", wait)


ZOO: tuple[Mutant, ...] = (
    Mutant(
        "split-rounds-up",
        "-",
        "tree._common_pages",
        "a cut inside a page rounds up: the split keeps a page the prompt does not share",
        _split_rounds_up,
    ),
    Mutant(
        "l3-any-checksum",
        "-",
        "L3File.verify",
        "an L3 read passes when its checksum is any written slot's, not its own slot's",
        _l3_any_checksum,
    ),
    Mutant(
        "rank-check-local-mode",
        "-",
        "CacheController.admit",
        "the cross-rank check follows each rank's own check_mode: a rank with checks off skips it",
        _rank_check_local_mode,
    ),
    Mutant(
        "prefetch-off-ticks-once",
        "-",
        "CacheController.admit",
        "with prefetch off, admit ticks once instead of until its restore settles",
        _prefetch_off_ticks_once,
    ),
    Mutant(
        "triton-one-page",
        "-",
        "triton_rows._launch",
        "Triton's gather and scatter move nothing for a transfer of one page (n <= 1)",
        _triton_one_page,
    ),
    Mutant(
        "layer-gate-lets-in",
        "-",
        "_PerLayerGate.wait",
        "a layer-wise load-back lets its reader read a layer before it landed",
        _layer_gate_lets_in,
    ),
)
