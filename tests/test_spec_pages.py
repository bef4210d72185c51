"""spec/l3.md and spec/policies.md against the code: their constants are the code's, and their
worked examples, run step by step, do what the pages say."""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

import pytest

from hicache.controller.backup import WANTED_MAX
from hicache.core.pages import pages
from hicache.dataplane.extents import Extent, coalesce
from hicache.dataplane.geometry import preset
from hicache.dataplane.l3format import HEADER_BYTES, VERSION
from hicache.oracle.speccheck import parse_tables
from hicache.policy import CostModel, make_policy, price_candidates
from hicache.policy.policies import EXPLORE_MARGIN, EXPLORE_SAMPLES, ThresholdPolicy

SPEC = Path(__file__).resolve().parents[1] / "spec"
UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def table(page: str, headers: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """The one table of `page` with these headers, rows keyed by their first cell."""
    (found,) = [
        t for t in parse_tables((SPEC / page).read_text(encoding="utf-8")) if t.headers == headers
    ]
    return {row[headers[0]]: row for _, row in found.rows}


def size(cell: str) -> int:
    number, _, unit = cell.partition(" ")
    return int(number.replace(",", "")) * UNITS[unit]


# -- spec/l3.md ----------------------------------------------------------------------------------


def test_l3_constants_are_the_codes() -> None:
    pytest.importorskip("torch")  # storage_io moves bytes with it
    from hicache.dataplane.storage_io import MAX_SHORT_RESUMES, PIECE_BYTES
    from hicache.dataplane.taskgroup import IO_THREADS, MAX_IO_THREADS

    rows = table("l3.md", ("Name", "Value", "Description"))
    code = {
        "HEADER_BYTES": HEADER_BYTES,
        "VERSION": VERSION,
        "PIECE_BYTES": PIECE_BYTES,
        "MAX_SHORT_RESUMES": MAX_SHORT_RESUMES,
        "MAX_IO_THREADS": MAX_IO_THREADS,
        "IO_THREADS": IO_THREADS,
    }
    assert {name: size(row["Value"]) for name, row in rows.items()} == code


def test_l3_checksum_test_vectors() -> None:
    from hicache.dataplane.checksums import ALGORITHMS, CRC32, available, checksum_function

    text = (SPEC / "l3.md").read_text(encoding="utf-8")
    vectors = re.findall(r"([a-z0-9-]+)\((.+?)\)\s*=\s*0x([0-9A-F]{8})", text)
    inputs = {'ASCII "123456789"': b"123456789", "2048 zero bytes": bytes(2048)}
    assert {(algorithm, name) for algorithm, name, _ in vectors} == {
        (a, n) for a in ALGORITHMS for n in inputs
    }
    for algorithm, name, hex_value in vectors:
        data = memoryview(inputs[name])
        if algorithm == CRC32:
            assert int(hex_value, 16) == zlib.crc32(data)
        if available(algorithm):  # xxhash is optional (the data extra)
            assert checksum_function(algorithm)(data) == int(hex_value, 16)


def test_l3_worked_example(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from hicache.dataplane.faults import FaultInjector, FaultSite
    from hicache.dataplane.handles import TransferStatus
    from hicache.dataplane.storage import L3File
    from hicache.dataplane.storage_io import StorageMover
    from hicache.errors import CorruptSlot

    geometry = preset("tiny")
    bpp, path = geometry.bytes_per_page, str(tmp_path / "l3.slots")
    assert bpp == 2048
    l2 = torch.randint(
        0, 256, (32, bpp), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    faults = FaultInjector()
    with (
        L3File(path, 8, bpp, geometry=geometry) as l3,
        StorageMover(l3, l2, faults=faults) as mover,
    ):
        assert os.path.getsize(path) == l3.size_bytes == 20_480
        # 1. Two extents; their offsets.
        assert coalesce(pages([7, 8, 9, 3]), pages([2, 3, 4, 5])) == [
            Extent(7, 2, 3),
            Extent(3, 5, 1),
        ]
        assert (l3.offset(2), l3.offset(5)) == (8192, 14_336)
        # 2-3. The first pwrite returns short once, is resumed; DONE records the checksums.
        faults.once(FaultSite.SHORT_WRITE)
        h2s = mover.h2s(pages([7, 8, 9, 3]), pages([2, 3, 4, 5]))
        assert not l3.written(pages([2, 3, 4, 5])).any()  # forgotten at issue
        assert h2s.wait(timeout_s=10) is TransferStatus.DONE, h2s.error
        assert mover.counters.short_io_resumed == 1
        for slot, page in zip((2, 3, 4, 5), (7, 8, 9, 3)):
            assert l3.checksum(slot) == l3.page_checksum(l2[page].numpy().data)
        # 4. A byte of slot 3 changes on disk: the promotion of slots 2, 3 fails on slot 3.
        at = l3.offset(3) + 1024
        os.pwrite(l3.fd, bytes([os.pread(l3.fd, 1, at)[0] ^ 0xFF]), at)
        s2h = mover.s2h(pages([2, 3]), pages([20, 21]))
        assert s2h.wait(timeout_s=10) is TransferStatus.FAILED
        assert isinstance(s2h.error, CorruptSlot) and s2h.error.slot == 3
        assert l3.corrupt_reads == 1
    # 5. Restart: the same path is taken over with every slot empty.
    with L3File(path, 8, bpp, geometry=geometry) as again:
        assert not again.written(pages(range(8))).any()
        assert os.path.getsize(path) == 20_480


# -- spec/policies.md ----------------------------------------------------------------------------


def test_restore_policy_example_prices_and_choices() -> None:
    text = (SPEC / "policies.md").read_text(encoding="utf-8")
    bpt = preset("qwen3-8b").bytes_per_token
    assert bpt == 147_456
    model = CostModel()
    cands = price_candidates(model, 320, 1600, 3200, 3504, bpt)
    for choice in ("recompute", "L2", "L3"):
        assert f"{cands.predicted_s[choice] * 1e3:.3f} ms" in text, choice
    rows = table("policies.md", ("policy", "chooses", "benefit", "why"))
    for name, row in rows.items():
        decision = make_policy(name, model).decide(320, 1600, 3200, 3504, bpt)
        assert decision.choice == row["chooses"], name
        expected = "0" if decision.benefit_s == 0 else f"{decision.benefit_s * 1e3:.3f} ms"
        assert row["benefit"] == expected, name
    # The constants the rules quote.
    assert (1 + EXPLORE_MARGIN, EXPLORE_SAMPLES) == (1.10, 2)
    threshold = ThresholdPolicy()
    assert (threshold.prefetch_tokens, threshold.load_back_tokens) == (256, 10)
    assert f"{WANTED_MAX:,}" in text


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_write_policy_example(write_policy: str) -> None:
    """The worked example's table, column `write_policy`, row by row."""
    pytest.importorskip("torch")
    from hicache.controller.config import CacheConfig
    from hicache.controller.controller import CacheController

    prompt = tuple(range(100, 124))
    c = CacheController(
        CacheConfig(
            device="cpu",
            l1_pages=8,
            l2_pages=32,
            l3_slots=64,
            policy="always",
            write_policy=write_policy,
        )
    )

    def serve(rid: int, tokens: tuple[int, ...]) -> None:
        c.admit(rid, tokens)
        while not c.ready(rid):
            c.tick()
        c.prefill(rid)
        c.finish(rid)
        c.drain()

    def nodes() -> list[tuple[int, int, tuple[str, ...]]]:
        """(key tokens, hits, states) of every node, the prompt's upper node first."""
        found = [(len(n.key), n.hits, tuple(n.state)) for n in c.cp.tree.nodes() if not n.is_root]
        return sorted(found, reverse=True)

    backed = ("RESIDENT",) * 3
    l1_only = ("RESIDENT", "ABSENT", "ABSENT")
    try:
        serve(1, prompt)
        assert nodes() == [(24, 0, backed if write_policy == "write_through" else l1_only)]
        serve(2, prompt)
        second = backed if write_policy == "write_through" else l1_only
        assert nodes() == [(20, 1, second), (4, 0, second)]
        serve(3, prompt)
        upper = l1_only if write_policy == "write_back" else backed
        assert nodes() == [(20, 2, upper), (4, 0, second)]
        # Another prompt of 24 tokens needs 6 of L1's 8 pages: the 4-token leaf goes first.
        serve(4, tuple(range(500, 524)))
        lost = c.metrics.dropped_tokens["write_through_unbacked_eviction"]
        tail = [n for n in c.cp.tree.nodes() if not n.is_root and n.key == prompt[20:]]
        if write_policy == "write_through_selective":
            assert lost >= 4 and not tail  # no copy anywhere: the node is gone
        else:
            assert lost == 0 and tail and tail[0].state[1:] == ["RESIDENT", "RESIDENT"]
    finally:
        c.close()


def test_hits_survive_a_split_on_both_halves() -> None:
    from hicache.core.tree import HiRadixTree

    tree = HiRadixTree(2)
    node = tree.add_child(tree.root, (1, 2, 3, 4))
    node.hits = 3
    upper = tree.split(node, 2)
    assert (upper.hits, node.hits) == (3, 3)
    tree.match((1, 2, 9, 9))
    assert (upper.hits, node.hits) == (4, 3)
