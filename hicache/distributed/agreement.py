"""The controller's side of the agreement points (spec/tp.md): one method per point.

Each method takes this rank's local answer and returns the answer every rank uses, through
one collective of its point (spec/tp.toml); with one rank (`Alone`) it returns the local
answer unchanged, so the single-rank controller runs the same code. The controller calls
each at the same place on every rank, unconditionally: a call that depends on local state
would be a conditional collective (F16), which the ranks' collective numbers expose.

    startup(fields)              C0   all_gather of field hashes: ConfigError on a difference
    admit(bounds, mask_for)      C1a  MIN of per-tier hits; C1b MIN of the L1 endpoint mask
    choice(code)                 C1c  rank 0's choice of restore
    serve(servable)              C1d  the largest planned node every rank can serve
    reserve(ok, pages, lost)     C2   commit on all, or release on all (L3 lost on one: on all)
    room(ok)                     C3   refuse everywhere unless every rank can make the room
    completion(local)            C4   per op in flight: done everywhere / failed somewhere / kept
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

from hicache.distributed.collectives import Alone, Collectives
from hicache.errors import ConfigError

NO_SLOT = (1 << 63) - 1  # `Local.bad_slot` of an op that found no bad L3 slot

Local = tuple[bool, bool, int, int, int]
"""One op's local state at a tick: (ended here, failed here, nodes kept here, bad-slot reason
(0 none, 1 corrupt, 2 unreadable), the bad slot or NO_SLOT)."""
Agreed = tuple[bool, bool, int, int, int]
"""One op's agreed state: (ended on every rank, failed on some rank, fewest nodes kept, the
worst bad-slot reason any rank found, the lowest bad slot)."""


def field_hash(value: object) -> int:
    """A configuration value's 63-bit hash (stable across processes: sha256 of its repr)."""
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "big") >> 1


class Agreement:
    """The agreement points over `collectives` (default: one rank)."""

    def __init__(self, collectives: Collectives | None = None) -> None:
        self.c: Collectives = collectives or Alone()

    @property
    def rank(self) -> int:
        return self.c.rank

    @property
    def size(self) -> int:
        return self.c.size

    # -- C0 -----------------------------------------------------------------------------------

    def startup(self, fields: Mapping[str, object]) -> None:
        """C0: every rank's configuration fields are equal; ConfigError naming the first that
        differs (`tp.fingerprint.<field>`) and the ranks whose value is not rank 0's."""
        names = list(fields)
        got = self.c.all_gather("startup", [field_hash(fields[n]) for n in names])
        for i, name in enumerate(names):
            differ = [r for r, row in enumerate(got) if row[i] != got[0][i]]
            if differ:
                raise ConfigError(f"tp.fingerprint.{name}",
                                  f"rank(s) {differ} differ from rank 0 (this rank {self.rank} has "
                                  f"{fields[name]!r}); every rank must be configured alike")

    # -- C1 -----------------------------------------------------------------------------------

    def admit(self, bounds: Sequence[int], mask_for: Callable[[int], Sequence[int]] | None
              ) -> tuple[int, ...]:
        """C1a, then C1b: the per-tier hits (anchor pages) every rank uses. `mask_for(U)` is
        this rank's L1 endpoint mask over 0..U (entry e = 1: e is a node end its pools
        accept), U being the agreed L1 bound; None where no endpoint rule applies (no
        trailing pool, or a policy that does not require it: the same on every rank)."""
        agreed = list(self.c.all_reduce_min("admit_bounds", list(bounds)))
        if mask_for is not None:
            mask = list(mask_for(agreed[0]))
            # Verify the mask's length is the agreed bound's, known to every rank (F17).
            assert len(mask) == agreed[0] + 1, (len(mask), agreed[0])
            common = self.c.all_reduce_min("admit_endpoints", mask)
            agreed[0] = max(e for e, ok in enumerate(common) if ok or e == 0)
        return tuple(agreed)

    def choice(self, code: int) -> int:
        """C1c: rank 0's choice code."""
        return self.c.all_gather("admit_choice", [code])[0][0]

    def serve(self, servable: Sequence[int]) -> int:
        """C1d: the largest index e with servable[e] = 1 on every rank (a page end of the
        prompt); servable[0] (serve none of the planned nodes) is always 1."""
        common = self.c.all_reduce_min("serve_endpoints", [1, *servable[1:]])
        return max(i for i, ok in enumerate(common) if ok)

    # -- C2, C3 -------------------------------------------------------------------------------

    def reserve(self, ok: bool, pages: int, lost: bool = False) -> tuple[bool, bool]:
        """C2: (whether every rank reserved and issued the same `pages` pages, whether some
        rank found its L3 file lost: then every rank takes L3 offline)."""
        low, ok_all, neg, kept = self.c.all_reduce_min("reserve", [pages, int(ok), -pages,
                                                                   int(not lost)])
        return bool(ok_all) and low == -neg, not kept

    def room(self, ok: bool) -> bool:
        """C3: whether every rank can make the room."""
        return bool(self.c.all_reduce_min("room", [int(ok)])[0])

    # -- C4 -----------------------------------------------------------------------------------

    def completion(self, local: Sequence[Local]) -> list[Agreed]:
        """C4 over the ops in flight (issue order, the same ops on every rank)."""
        n = len(local)
        got = self.c.all_reduce_min("completion", [int(x[0]) for x in local]
                                    + [int(not x[1]) for x in local] + [x[2] for x in local]
                                    + [-x[3] for x in local] + [x[4] for x in local])
        return [(bool(got[i]), not got[n + i], got[2 * n + i], -got[3 * n + i], got[4 * n + i])
                for i in range(n)]


__all__ = ["Agreed", "Agreement", "Local", "field_hash"]
