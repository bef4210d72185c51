"""Digests of L3 slots as a read would serve them (invariant I4), for any `L3File`.

A slot is *servable* when it can be read whole and its bytes match the checksum recorded
when it was written; an unservable slot digests as `UNSERVABLE` (I4 exempts it: the read that
meets it is a miss). The single-pool engine asks this of its one file, the group engine of
each pool's file. Reads go straight to the file (`os.preadv`, short reads resumed), never
through the movers, so a digest never changes what a transfer sees.
"""

from __future__ import annotations

import os

import numpy as np
import numpy.typing as npt
import torch

from hicache.core.pages import Pages
from hicache.core.snapshot import UNSERVABLE
from hicache.dataplane.pools import DIGEST_BATCH_BYTES, digest_rows
from hicache.dataplane.storage import L3File


def slot_digests(l3: L3File, slots: Pages) -> npt.NDArray[np.uint64]:
    """One uint64 per slot of `slots` (validated by the caller): `digest_rows` of the slot's
    bytes, or `UNSERVABLE`. Reads at most DIGEST_BATCH_BYTES at a time."""
    bpp = l3.bytes_per_page
    per_batch = max(1, DIGEST_BATCH_BYTES // bpp)
    out = np.empty(slots.size, dtype=np.uint64)
    for start in range(0, slots.size, per_batch):
        batch = slots[start : start + per_batch]
        rows = torch.empty((batch.size, bpp), dtype=torch.uint8)
        servable = np.ones(batch.size, dtype=bool)
        for i, (row, slot) in enumerate(zip(rows.numpy(), batch.tolist())):
            servable[i] = read_servable(l3, int(slot), memoryview(row))
        digests = digest_rows(rows)
        digests[~servable] = UNSERVABLE
        out[start : start + batch.size] = digests
    return out


def read_servable(l3: L3File, slot: int, into: memoryview) -> bool:
    """Read one whole slot into `into` (resuming short reads); whether a read would serve it:
    it could be read whole and its bytes match the slot's recorded checksum."""
    done, offset = 0, l3.offset(slot)
    while done < len(into):
        try:
            got = os.preadv(l3.fd, [into[done:]], offset + done)
        except OSError:
            return False
        if got == 0:
            return False  # the file ends before the slot: truncated under us
        done += got
    recorded = l3.checksum(slot)
    return recorded is not None and l3.page_checksum(into) == recorded
