"""The spec/trace.md trace of vLLM's tiering manager (vllm_tiering.py, `traced=True`): vLLM's
base trace (vllm_trace.py: L1, the GPU<->CPU jobs, L2's evictions) and the file tier's jobs.

    vLLM did                                   events (spec/trace.md)
    -----------------------------------------  --------------------------------------------
    admission                                  begin_request's hit names L3 too: the leading
                                               pages whose block file exists
    complete_store cascades a store job to     h2s_issue per page (tier L3, op = the file
      the file tier                              job); a page L3 has already is left out (the
                                               tier's `_store_block` skips an existing file)
    that job played: written / not             h2s_complete / h2s_fail per page, at once
                                               (the next lookup finds the files; vLLM's
                                               poll only unpins the CPU chunks)
    a promotion job submitted (on_schedule_    s2h_issue per page (tier L2)
      end: the file blocks one request found)
    its read ran over the first k blocks, and  s2h_complete for those k, s2h_fail for the
      vLLM polled the job (the chunks          rest (rule 4's partial end); k is what the
      published or freed: complete_write)      tier's read task itself read (counted when
                                               it ran), not what the job reports: a job
                                               reported done whose read never ran is
                                               s2h_fail, every page. Not at the read: until
                                               the poll, vLLM's lookup answers HIT_PENDING
    L3 eviction                                none: the file tier never evicts (results,
                                               finding 6)
    a block file gone: a short read deleted    invalidate_l3 per page, deepest first, once no
      it, or another writer removed it         file job reads or writes it (spec: a slot a
      (damage)                                 read found unreadable, or whose file went
                                               offline, is dropped, never served)

The header's L3 capacity is `L3_UNBOUNDED` (the file tier has no capacity; the spec's counts
reach 2^24). A trace has no restart event: the adapter writes one trace per opened engine, and
a traced adapter opens each engine on a fresh directory (`persistent=False`), so every trace
starts from the protocol's empty start.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hicache.testing.adapters.vllm_fs import STORE
from hicache.testing.adapters.vllm_trace import Prefix, VLLMTrace

L3_UNBOUNDED = 2**24  # the header's largest count: the file tier never fills


class VLLMTieringTrace(VLLMTrace):
    """VLLMTrace with the file tier's jobs; `l3_hit(tokens)`: tokens of `tokens` whose block
    files exist, leading (the admission's L3 hit)."""

    def __init__(
        self,
        page_size: int,
        capacities: dict[str, int],
        engine: str,
        l3_hit: Callable[[Prefix], int],
        hash_keyed_tiers: tuple[str, ...] = (),
    ) -> None:
        caps = {**capacities, "L3": L3_UNBOUNDED}
        super().__init__(page_size, caps, engine, hash_keyed_tiers)
        self.l3_hit = l3_hit
        self.in_l3: set[Prefix] = set()  # pages the trace put in L3 (pending or resident)
        self.file_ops: dict[int, list[Prefix]] = {}  # a file op's traced pages, parent first

    def begin(self, request: int, tokens: Prefix, l1: int, l2: int, l3: int = 0) -> None:
        super().begin(request, tokens, l1, l2, l3 or self.l3_hit(tokens))

    def file_issue(self, op: int, kind: str, pages: Sequence[Prefix]) -> None:
        """A file job queued: a cascade (STORE: h2s_issue) or a promotion (s2h_issue)."""
        if kind == STORE:
            pages = [p for p in pages if p not in self.in_l3]
            self.in_l3.update(pages)
        self.file_ops[op] = sorted(pages, key=len)
        if self.file_ops[op]:
            event, tier = ("h2s_issue", "L3") if kind == STORE else ("s2h_issue", "L2")
            self.transfer(event, tier, op, self.file_ops[op], 0)

    def file_end(self, op: int, kind: str, landed: Sequence[Prefix]) -> None:
        """File job `op` ended, `landed` the pages whose bytes moved (the module docstring)."""
        pages = self.file_ops.pop(op)
        done = [p for p in pages if p in landed]
        failed = [p for p in pages if p not in landed]
        prefix, tier = ("h2s", "L3") if kind == STORE else ("s2h", "L2")
        self.in_l3.difference_update(failed if kind == STORE else ())
        self.transfer(f"{prefix}_complete", tier, op, done, 0)
        self.transfer(f"{prefix}_fail", tier, op, failed, 0)

    def vanished(self, gone: Sequence[Prefix]) -> None:
        """The block files of `gone` no longer exist: invalidate_l3 for each page the trace
        holds in L3 that no file job reads or writes now (one that does is judged when its
        job ends: the caller asks again then), deepest first."""
        busy = {p for pages in self.file_ops.values() for p in pages}
        dropped = [p for p in gone if p in self.in_l3 and p not in busy]
        for page in sorted(dropped, key=lambda p: (-len(p), p)):
            self._page("invalidate_l3", page, tier="L3")
            self.in_l3.discard(page)
