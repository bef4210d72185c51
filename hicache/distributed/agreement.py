"""The controller's side of the agreement points (spec/tp.md): one method per point.

Each method takes this rank's local answer and returns the answer every rank uses, through
one collective of its point (spec/tp.toml); with one rank (`Alone`) it returns the local
answer unchanged, so the single-rank controller runs the same code. The controller calls
each at the same place on every rank, unconditionally (R70): a call that depends on local
state would be a conditional collective (F16), which the ranks' collective numbers expose.
The caller acts on the returned answer only, never on its own where a point exists (R71).

    startup(fields)              C0   all_gather of field hashes: ConfigError on a difference
    admit(bounds, own, code, m,  C1a  MIN of per-tier hits, the L1 endpoint masks intersected;
          carried)                    rank 0's choice when its own hits are the agreed ones;
                                      carries C4 over the ops in flight (their agreed ends)
    choice(code)                 C1b  rank 0's choice of restore, made on the agreed hits
    serve(servable, room)        C1c  the largest planned node every rank can serve, and (C3)
                                      whether every rank can make the room for the rest
    reserve(ok, pages)           C2   commit on all, or release on all; only where L1 frees
                                      windows and the transfer touches L1 (else C4 agrees it)
    completion(local)            C4   per op in flight: done everywhere / failed somewhere / kept;
                                      refused somewhere (C2 deferred) fails it everywhere, an
                                      L3 file lost at its issue takes L3 offline everywhere;
                                      none in flight (agreed state): no collective;
                                      a tick after an admission makes none (C1a carried it)
    l3_share(files)              C6a  rank 0's replicated pools' L3 files, for the others to read;
                                      StorageError when a rank runs on another host than rank 0
    l3_ack(slots, checksums)     C6b  rank 0's checksums of what it wrote; slots equal everywhere
    check(view)                  C7-C9 hashes of the view and the log; on a difference the views
                                      themselves, and the cross-rank invariants over them
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping, Sequence

from hicache.core.snapshot import RankView
from hicache.distributed.collectives import Alone, Collectives, Guarded
from hicache.distributed.rankview import bytes_hash, decode_view, encode_view, state_hash
from hicache.errors import ConfigError, StorageError
from hicache.invariants import RANK_CHECKS, Violation, check_ranks

NO_SLOT = (1 << 63) - 1  # `Local`'s first bad page of an op that found no bad L3 slot
NO_CHECKSUM = (1 << 63) - 1  # C6b: a rank that wrote none of a slot (every rank but 0)

Local = tuple[bool, bool, int, int, int, bool]
"""One op's local state at a tick: (ended here, failed here, nodes kept here, bad-slot reason
(0 none, 1 corrupt, 2 unreadable), the position in the op's source pages of the first bad
slot its read found here, or NO_SLOT; its issue was refused here because this rank's L3 file
is lost, C2 deferred)."""
Agreed = tuple[bool, bool, int, int, int, bool]
"""One op's agreed state: (ended on every rank, failed on some rank, fewest nodes kept, the
worst bad-slot reason any rank found, the first bad page any rank found: the least position,
so every copy from it on is dropped on every rank, whichever bad slots each rank met; some
rank's L3 file was lost at its issue: L3 goes offline on every rank)."""


def encode_ends(local: Sequence[Local]) -> list[int]:
    """C4's payload (also carried by C1a): 6n values, n the ops in flight, whose column MIN
    is the agreed end of each op (`decode_ends`)."""
    return (
        [int(x[0]) for x in local]
        + [int(not x[1]) for x in local]
        + [x[2] for x in local]
        + [-x[3] for x in local]
        + [x[4] for x in local]
        + [int(not x[5]) for x in local]
    )


def decode_ends(got: Sequence[int]) -> list[Agreed]:
    """The agreed ends from the MIN of every rank's `encode_ends` (6n values)."""
    n = len(got) // 6
    return [
        (
            bool(got[i]),
            not got[n + i],
            got[2 * n + i],
            -got[3 * n + i],
            got[4 * n + i],
            not got[5 * n + i],
        )
        for i in range(n)
    ]


def host_id() -> int:
    """This host's 63-bit id: a hash of its boot id (new at every boot, different on every
    host), or of its host name where the boot id cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            name = f.read().strip()
    except OSError:
        name = socket.gethostname()
    return field_hash(name) or 1


def field_hash(value: object) -> int:
    """A configuration value's 63-bit hash (stable across processes: sha256 of its repr).
    R80: every rank hashes with this one function (C0; C7-C9 use the same construction)."""
    return int.from_bytes(hashlib.sha256(repr(value).encode()).digest()[:8], "big") >> 1


class Agreement:
    """The agreement points over `collectives` (default: one rank)."""

    def __init__(self, collectives: Collectives | None = None) -> None:
        self.c = Guarded(collectives or Alone())  # refuses every call once a collective failed

    @property
    def rank(self) -> int:
        return self.c.rank

    @property
    def size(self) -> int:
        return self.c.size

    @property
    def tp(self) -> bool:
        """More than one rank: the agreement points make collectives. The same on every rank
        (the group's size), so no collective depends on a rank's own answer to it."""
        return self.c.size > 1

    # -- C0 -----------------------------------------------------------------------------------

    def startup(self, fields: Mapping[str, object]) -> None:
        """C0: every rank's configuration fields are equal; ConfigError naming the first that
        differs (`tp.fingerprint.<field>`) and the ranks whose value is not rank 0's."""
        names = list(fields)
        got = self.c.all_gather("startup", [field_hash(fields[n]) for n in names])
        for i, name in enumerate(names):
            differ = [r for r, row in enumerate(got) if row[i] != got[0][i]]
            if differ:
                raise ConfigError(
                    f"tp.fingerprint.{name}",
                    f"rank(s) {differ} differ from rank 0 (this rank {self.rank} has "
                    f"{fields[name]!r}); every rank must be configured alike",
                )

    # -- C1 -----------------------------------------------------------------------------------

    def admit(
        self,
        bounds: Sequence[int],
        own_l1: int,
        code: int,
        mask: Sequence[int] | None,
        carried: Sequence[Local] = (),
    ) -> tuple[tuple[int, ...], int | None, list[Agreed]]:
        """C1a: (the per-tier hits in anchor pages every rank uses, rank 0's choice code or
        None). `bounds`: this rank's L1 leading run (before the endpoint rule when it sends
        a mask; else its L1 hit), L2 and L3 hits;
        `own_l1`: its L1 hit after its own window rule; `code`: its policy's choice on its own
        hits; `mask`: its L1 endpoint mask over the prompt's page ends 0..P (entry e = 1: e is
        a node end of its run its pools accept), None where no endpoint rule applies (no
        trailing pool, or a policy that does not require it: the same on every rank).

        `carried`: this rank's ends of the ops in flight (issue order, as C4's `local`: the
        same ops on every rank, so the length is agreed state), carried by this gather so
        that the tick after the admission makes no C4 of its own (spec/tp.md, "C4 carried by
        C1a"); their agreed ends come back third, as `completion` returns them, for the
        caller to apply once the admission pinned its plan.

        The choice is None when rank 0's own hits are not the agreed ones: its choice was
        made on other hits, and C1b (`choice`) asks it again. Every rank sees rank 0's row,
        so every rank makes that call or none (no conditional collective)."""
        width = 5 + (len(mask) if mask is not None else 0)
        row = [*bounds, own_l1, code, *(mask if mask is not None else ()), *encode_ends(carried)]
        rows = self.c.all_gather("admit", row)
        agreed = [min(col) for col in zip(*(r[:3] for r in rows))]
        ends = decode_ends([min(col) for col in zip(*(r[width:] for r in rows))])
        if mask is not None:
            common = [min(col) for col in zip(*(r[5:width] for r in rows))]
            # The intersection's largest endpoint within the agreed run, never the minimum
            # of per-rank maxima (which may be legal on no rank but one).
            agreed[0] = max(
                e for e in range(min(agreed[0], len(common) - 1) + 1) if common[e] or e == 0
            )
        head = rows[0]
        rank0 = head[4] if (head[3], head[1], head[2]) == tuple(agreed) else None
        return tuple(agreed), rank0, ends

    def choice(self, code: int) -> int:
        """C1b: rank 0's choice code (made on the agreed hits)."""
        return self.c.all_gather("admit_choice", [code])[0][0]

    def serve(self, servable: Sequence[int], room: Sequence[int]) -> tuple[int, bool]:
        """C1c, carrying C3: (the largest index e with servable[e] = 1 on every rank, whether
        every rank can make the room when serving through e). Both are masks over the
        prompt's page ends; servable[0] (serve none of the planned nodes) is always 1, and
        room[e] matters only where servable[e] is 1."""
        # Verify both masks have the prompt's length (F17: never the local plan's).
        assert len(servable) == len(room), (len(servable), len(room))
        n = len(servable)
        common = self.c.all_reduce_min("serve", [1, *servable[1:], *room])
        served = max(i for i in range(n) if common[i])
        return served, bool(common[n + served])

    # -- C2 -------------------------------------------------------------------------------

    def reserve(self, ok: bool, pages: int) -> bool:
        """C2: whether every rank reserved and issued the same `pages` pages. R72: every rank
        then commits, or every rank aborts. Made only for a transfer into or out of L1 on a
        group whose L1 frees windows (`Transfers.defers`); elsewhere C4 agrees the issue."""
        low, ok_all, neg = self.c.all_reduce_min("reserve", [pages, int(ok), -pages])
        return bool(ok_all) and low == -neg

    # -- C4 -----------------------------------------------------------------------------------

    def completion(self, local: Sequence[Local]) -> list[Agreed]:
        """C4 over the ops in flight (issue order, the same ops on every rank). None in
        flight: no collective (an idle tick). The ops in flight are state every rank holds
        equal (every rank takes each op it issues, refused or not: C2; C4 and C5 agree every
        end), so every rank skips alike (R70)."""
        if not local:
            return []
        return decode_ends(self.c.all_reduce_min("completion", encode_ends(local)))

    # -- C6a, C6b: a replicated pool's one L3 copy ---------------------------------------------

    def l3_share(self, files: Sequence[int]) -> tuple[int, ...]:
        """C6a: rank 0's `files` (per replicated pool, its process id and its L3 file's
        descriptor; zeros on a plane without bytes), each rank sending its host's id first.
        ConfigError when rank 0 has no bytes to share and this rank has (or the other way
        round): the ranks' planes differ. StorageError, on every rank, when a rank with
        bytes runs on another host than rank 0: rank 0's file is out of its reach."""
        has_bytes = any(files)
        rows = self.c.all_gather("l3_share", [host_id() if has_bytes else 0, *files])
        without = [r for r, row in enumerate(rows) if not any(row[1:])]
        if without and len(without) < len(rows):
            raise ConfigError(
                "tp.engine",
                f"rank(s) {without} run a data plane without bytes "
                "and the others one with bytes: every rank must run the same kind "
                "of data plane",
            )
        elsewhere = [r for r, row in enumerate(rows) if row[0] != rows[0][0]]
        if elsewhere:
            raise StorageError(
                "of rank 0",
                f"rank(s) {elsewhere} run on another host than rank 0: a replicated pool's "
                "one L3 copy is rank 0's file, which only processes of its host can read; run "
                "every rank of the group on one host, or back up only sharded pools",
            )
        return tuple(rows[0][1:])

    def l3_ack(
        self, slots: Sequence[int], checksums: Sequence[int | None]
    ) -> tuple[list[int | None], list[int]]:
        """C6b over the L3 slots of the replicated pools of the H2S ops C4 just ended (issue
        order, the same on every rank): (rank 0's checksum per slot, None where rank 0 has
        none to give -- no bytes; the indices of slots that differ between ranks). `checksums`:
        this rank's own, None where it wrote none (every rank but 0)."""
        # Verify one checksum per slot: the payload's length is the slots' (the same everywhere).
        assert len(slots) == len(checksums), (len(slots), len(checksums))
        n = len(slots)
        got = self.c.all_reduce_min(
            "l3_ack",
            [*slots, *(-s for s in slots), *(NO_CHECKSUM if c is None else c for c in checksums)],
        )
        differ = [i for i in range(n) if got[i] != -got[n + i]]
        return [None if c == NO_CHECKSUM else c for c in got[2 * n :]], differ

    # -- C7-C9 --------------------------------------------------------------------------------

    def check(self, view: RankView) -> list[Violation]:
        """C7-C9, the cross-rank check: every rank's I7 state hash, I8 bytes hash and
        collective log (count, digest) are gathered; when any differs (every rank sees it, so
        every rank goes on alike) every rank's `view` is gathered (the length is C7's: the
        longest view) and the cross-rank invariants run over them. Returns the violations,
        the same list on every rank (empty when the hashes agree)."""
        words, nbytes = encode_view(view)
        states = self.c.all_gather("check_state", [state_hash(view), len(words), nbytes])
        digests = self.c.all_gather("check_bytes", [bytes_hash(view)])  # C8, judged by I8
        log = self.c.log
        logs = self.c.all_gather("check_log", [log.count, int(log.digest, 16) >> 1])
        # Each rank's (state hash, bytes hash, log count, log digest); view lengths may differ
        # (a rank's own L3 writes and log tail are in it).
        keys = [(states[r][0], digests[r][0], *logs[r]) for r in range(self.size)]
        if len(set(keys)) == 1:
            return []
        width = max(r[1] for r in states)
        rows = self.c.all_gather("check_state", words + [0] * (width - len(words)))
        views = [decode_view(row, states[r][2]) for r, row in enumerate(rows)]
        found = check_ranks(views)
        if not found:  # the hashes differ where no check looks: say so, never pass silently
            differ = [r for r in range(self.size) if keys[r] != keys[0]]
            i7 = RANK_CHECKS[0]  # rank_agreement: the views were to be equal
            found = [
                Violation(
                    i7.id,
                    i7.name,
                    None,
                    (),
                    (),
                    (),
                    f"rank(s) {differ}'s view hashes "
                    "differ from rank 0's, yet no cross-rank check names a difference",
                )
            ]
        return found


__all__ = ["Agreed", "Agreement", "Local", "decode_ends", "encode_ends", "field_hash"]
