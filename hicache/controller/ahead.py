"""Layer-wise prefill: compute on a restore whose H2D is still landing.

Contract (spec/restore.md, "Layer-wise load-back", R82-R84). With `CacheConfig.layerwise`, a
restore is *landing* when the only op it waits for is its own H2D -- the L2 part's, or an L3
part's once promoted (its S2H done) -- and that transfer's handle has a `gate`
(dataplane/layerwise.py): no shared load-back, one rank, a producer with `compute_kv`. A
landing restore is `ready`, and its `prefill`:

1. computes ahead: `compute_kv` on the prefix -- the L1 hit's pages, then the op's target
   pages, in token order -- from the op's last node to the prompt's `prefill_end`; the
   producer reads layer `l` of the prefix only after `gate.wait(l)`. Nothing is written to
   L1 and no state changes (R83). The work is queued on the caller's stream, not waited
   for (`wait=False`): steps 2 and 3 run on the host while the device computes;
2. settles: waits for the op's end and applies it as phase 1 of a tick would, for this op
   alone (published and pinned, or dropped with its fallback); nothing else advances;
3. prefills as always, except where the KV computed ahead may stand in for a second producer
   run (`take`): the op ended DONE, and the prefill starts where the ahead began, on the same
   prefix pages, and ends where it ended. Otherwise the KV is thrown away
   (`ahead_discarded_total`) and the producer runs again on what did land (R84): a layer
   that failed, or was never waited for, must not reach the tree. The KV taken is written
   behind the computation in the same stream (`write_kv`), and the prefill returns once the
   stream has done both (`written`), as a prefill that ran the producer does: whatever
   the caller does next with L1, and the restore's observed latency (the cost model's
   sample), come after the bytes.

Queued, not waited for, is safe for every other user of L1: a transfer's mover starts after
the caller's stream's queued work (B05), and a KV thrown away was allocated on that stream, so
its memory is reused only behind the computation.

Why not publish on the gate: the gate says when a layer's bytes are *there*, not that the
transfer *succeeded* -- only the handle's end says that, so the control plane learns the op's
end exactly as without layer-wise landing, and no state machine changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from hicache.controller.materialize import Materialization
from hicache.core.control import ControlPlane
from hicache.core.records import PendingOp
from hicache.core.tiers import Direction, Tier
from hicache.dataplane.handles import TransferHandle, TransferStatus

if TYPE_CHECKING:  # torch-heavy: a producer exists only on a plane with bytes
    from hicache.producers.base import LayerwiseProducer


@dataclass
class Ahead:
    """KV computed on a landing restore (`[K/V, layer, end - start, kv_head, head_dim]`),
    what it was computed on, and the transfer whose end decides whether it stands."""

    start: int
    end: int
    prefix: npt.NDArray[np.int64]  # L1 pages read, in token order
    kv: Any  # torch.Tensor
    handle: TransferHandle


def landing(
    mat: Materialization,
    cp: ControlPlane,
    handles: dict[int, TransferHandle],
) -> tuple[PendingOp, TransferHandle] | None:
    """The restore's one H2D still landing with a gate, or None (module docstring: the
    caller checks the configuration, the ranks and the producer)."""
    # An L3 restore lands too, at its last step: the promoted part's H2D, once its S2H is
    # done and the L2 part is in L1 (the H2D is its one op then).
    pending_l3 = bool(mat.l3_part) and not mat.l3_h2d_issued
    if mat.awaited or mat.deferred or pending_l3 or mat.shared or len(mat.ops) != 1:
        return None
    (op_id,) = mat.ops
    op, handle = cp.ops.get(op_id), handles.get(op_id)
    if op is None or handle is None or handle.gate is None or op.direction is not Direction.H2D:
        return None
    return op, handle


def compute_ahead(
    mat: Materialization,
    op: PendingOp,
    handle: TransferHandle,
    cp: ControlPlane,
    producer: LayerwiseProducer,
    l1: Any,
    end: int,
) -> Ahead | None:
    """Step 1: the KV of tokens `[start of nothing cached, end)` past the op's last node,
    computed on the landing prefix; None when there is nothing to compute."""
    start = cp.tree.prefix_tokens(op.nodes[-1])
    if end <= start:
        return None
    parent = op.nodes[0].parent
    assert parent is not None, "an H2D's chain hangs under a live node (S6)"
    above = cp.prefix_pages(parent, Tier.L1)  # the L1 hit: held, locked by the request
    prefix = np.concatenate([np.asarray(above, np.int64), np.asarray(op.target_pages, np.int64)])
    assert handle.gate is not None, "a landing op has a gate"
    padded = tuple(mat.tokens) + (0,) * (end - len(mat.tokens))
    kv, _ = producer.compute_kv(padded, start, end, l1, prefix, handle.gate, wait=False)
    return Ahead(start, end, prefix, kv, handle)


def take(ahead: Ahead | None, start: int, end: int, prefix: npt.NDArray[np.int64]) -> Any:
    """Step 3: the KV computed ahead if it may stand for tokens `[start, end)` on `prefix`
    (R84: its transfer ended DONE, same range, same pages), else None."""
    if ahead is None or ahead.handle.status is not TransferStatus.DONE:
        return None
    if (ahead.start, ahead.end) != (start, end):
        return None
    if not np.array_equal(ahead.prefix, np.asarray(prefix, np.int64)):
        return None
    return ahead.kv


def write_kv(l1: Any, new_pages: npt.NDArray[np.int64], kv: Any) -> None:
    """Queue the write of KV computed ahead into the prefill's new pages (`base.write_pages`,
    bit for bit) on the caller's stream, behind its computation (no host wait)."""
    import torch  # torch-heavy: only a plane with bytes computes ahead

    from hicache.producers.base import write_pages

    index = torch.from_numpy(np.asarray(new_pages, np.int64)).to(l1.device, non_blocking=True)
    write_pages(l1, index, kv)


def written(l1: Any) -> None:
    """Step 3's end: wait until the caller's stream has computed and written the KV taken
    (a no-op on the CPU, where both ran in their calls)."""
    import torch  # torch-heavy: only a plane with bytes computes ahead

    if l1.device.type == "cuda":
        torch.cuda.current_stream(l1.device).synchronize()
