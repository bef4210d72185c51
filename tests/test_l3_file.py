"""The L3 file at an explicit path: its header, and what it does with a path that exists.

A path that is not a hicache L3 file -- a text file, a symlink, a FIFO -- is refused and left
exactly as it was (bytes, mode, a symlink's target); a hicache L3 file is taken over with every
slot empty; the overwrite flag replaces a foreign regular file, never a symlink.
"""

from __future__ import annotations

import os
import stat
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the data plane): pip install -e '.[data]'")

import torch

from hicache.app import demo
from hicache.controller.config import CacheConfig
from hicache.core.pages import pages
from hicache.core.snapshot import UNSERVABLE
from hicache.dataplane import checksums
from hicache.dataplane.checksums import CRC32, XXH3_LOW32, available, default_algorithm
from hicache.dataplane.engine import TransferEngine, one_pool
from hicache.dataplane.geometry import KVGeometry, preset
from hicache.dataplane.handles import TransferStatus
from hicache.dataplane.l3format import FIELDS_BYTES, HEADER_BYTES, LAYOUT, L3Header, decode, encode
from hicache.dataplane.storage import L3File, share_path
from hicache.dataplane.storage_io import StorageMover
from hicache.errors import ConfigError, L3InUse, L3PathRefused, StorageError
from hicache.oracle.speccheck import check_l3_header

BPP = 3080  # not a multiple of 4096: an offset that forgot the header or B shows
SLOTS = 8
TEXT = b"my notes\nnothing to do with a KV cache\n" * 300
SPEC_L3 = Path(__file__).resolve().parent.parent / "spec" / "l3.md"


def snapshot(path: Path) -> tuple[bytes, int]:
    """A regular file's bytes and permission bits (through symlinks)."""
    return path.read_bytes(), stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_bytes(TEXT)
    path.chmod(0o640)
    return path


def l3_header_of(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(HEADER_BYTES)


def write_slot(l3: L3File, slot: int, seed: int) -> torch.Tensor:
    """H2S one random page into `slot`; returns the page."""
    g = torch.Generator().manual_seed(seed)
    l2 = torch.randint(0, 256, (1, l3.bytes_per_page), dtype=torch.uint8, generator=g)
    with StorageMover(l3, l2, io_threads=1) as mover:
        assert mover.h2s(pages([0]), pages([slot])).wait(timeout_s=10) is TransferStatus.DONE
    return l2[0]


def read_slot(l3: L3File, slot: int) -> torch.Tensor:
    """S2H `slot` (checked against its recorded checksum) into a fresh page; returns it."""
    l2 = torch.zeros((1, l3.bytes_per_page), dtype=torch.uint8)
    with StorageMover(l3, l2, io_threads=1) as mover:
        assert mover.s2h(pages([slot]), pages([0])).wait(timeout_s=10) is TransferStatus.DONE
    return l2[0]


# -- refusing what is not ours ------------------------------------------------------------------


def test_a_text_file_is_refused_and_left_unchanged(text_file: Path) -> None:
    before = snapshot(text_file)
    with pytest.raises(L3PathRefused) as info:
        L3File(str(text_file), SLOTS, BPP)
    assert snapshot(text_file) == before == (TEXT, 0o640)
    e = info.value
    assert e.path == str(text_file) and str(text_file) in str(e)
    assert "not a hicache L3 file" in str(e) and "nothing was changed" in str(e)
    assert e.overwrite_helps and "l3_overwrite" in str(e)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_symlink_is_never_followed_even_to_overwrite(
    tmp_path: Path, text_file: Path, overwrite: bool
) -> None:
    link = tmp_path / "l3.slots"
    link.symlink_to(text_file)
    before = snapshot(text_file)
    with pytest.raises(L3PathRefused, match="symbolic link") as info:
        L3File(str(link), SLOTS, BPP, overwrite=overwrite)
    assert snapshot(text_file) == before and link.is_symlink()
    assert not info.value.overwrite_helps and "l3_overwrite" not in str(info.value)


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_symlink_to_an_l3_file_or_to_nowhere_is_refused(tmp_path: Path, overwrite: bool) -> None:
    real = tmp_path / "real.slots"
    L3File(str(real), SLOTS, BPP).close()
    before = real.read_bytes()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    for link, target in ((tmp_path / "to-l3", real), (dangling, None)):
        if target is not None:
            link.symlink_to(target)
        with pytest.raises(L3PathRefused, match="symbolic link"):
            L3File(str(link), SLOTS, BPP, overwrite=overwrite)
    assert real.read_bytes() == before
    assert not (tmp_path / "would-be-created").exists()  # O_EXCL never creates through a link


@pytest.mark.parametrize("overwrite", [False, True])
def test_non_regular_files_are_refused_even_with_overwrite(tmp_path: Path, overwrite: bool) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad in (fifo, tmp_path):
        with pytest.raises(L3PathRefused, match="not a regular file") as info:
            L3File(str(bad), SLOTS, BPP, overwrite=overwrite)
        assert info.value.path == str(bad) and not info.value.overwrite_helps
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def garbled(kind: str) -> bytes:
    """Bytes that start like (or nothing like) an L3 header but must not be taken for one."""
    good = encode(L3Header(BPP, SLOTS, None)) + bytes(SLOTS * BPP)
    if kind == "empty":
        return b""
    if kind == "magic only":
        return good[:8]
    if kind == "truncated fields":
        return good[: FIELDS_BYTES - 1]
    if kind == "flipped slots field":
        return good[:24] + bytes([good[24] ^ 1]) + good[25:]
    if kind == "wrong magic":
        return b"HICACHL4" + good[8:]
    if kind == "version 1":  # the layout before the checksum field: crc32 at 56
        head = good[:8] + struct.pack("<I", 1) + good[12:56]
        return head + struct.pack("<I", zlib.crc32(head)) + good[60:]
    assert kind == "future version"
    head = good[:8] + struct.pack("<I", 3) + good[12:72]
    return head + struct.pack("<I", zlib.crc32(head)) + good[76:]


@pytest.mark.parametrize(
    "kind,why",
    [
        ("empty", "not a hicache L3 file"),
        ("magic only", "truncated"),
        ("truncated fields", "truncated"),
        ("flipped slots field", "damaged"),
        ("wrong magic", "not a hicache L3 file"),
        ("version 1", "format version 1; this hicache reads version 2"),
        ("future version", "format version 3"),
    ],
)
def test_a_truncated_or_garbled_header_is_refused(tmp_path: Path, kind: str, why: str) -> None:
    path = tmp_path / "l3.slots"
    path.write_bytes(garbled(kind))
    path.chmod(0o600)
    before = snapshot(path)
    with pytest.raises(L3PathRefused, match=why):
        L3File(str(path), SLOTS, BPP)
    assert snapshot(path) == before
    with L3File(str(path), SLOTS, BPP, overwrite=True) as f:  # the explicit way out
        assert decode(l3_header_of(path)) == f.header


# -- the slot checksum the header names (checksums.py) -----------------------------------------

needs_xxhash = pytest.mark.skipif(
    not available(XXH3_LOW32), reason="needs xxhash: pip install -e '.[data]'"
)


@needs_xxhash
@pytest.mark.parametrize("written,wanted", [(CRC32, XXH3_LOW32), (XXH3_LOW32, CRC32)])
def test_a_file_of_another_checksum_is_refused_unless_overwritten(
    tmp_path: Path, written: str, wanted: str
) -> None:
    path = tmp_path / "l3.slots"
    with L3File(str(path), SLOTS, BPP, checksum=written) as f:
        assert f.header.checksum == written
        write_slot(f, 1, seed=2)
    before = snapshot(path)
    with pytest.raises(L3PathRefused, match=f"checksummed with {written}, not {wanted}") as info:
        L3File(str(path), SLOTS, BPP, checksum=wanted)
    assert info.value.path == str(path) and info.value.overwrite_helps
    assert snapshot(path) == before
    with L3File(str(path), SLOTS, BPP, checksum=written):  # its own algorithm: taken over
        pass
    with L3File(str(path), SLOTS, BPP, checksum=wanted, overwrite=True) as f:
        assert decode(l3_header_of(path)).checksum == wanted == f.header.checksum


def test_a_header_naming_an_unknown_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l3.slots"
    path.write_bytes(encode(L3Header(BPP, SLOTS, None, checksum="md5")) + bytes(SLOTS * BPP))
    with pytest.raises(L3PathRefused, match="checksummed with md5"):
        L3File(str(path), SLOTS, BPP)
    with pytest.raises(ConfigError, match="l3.checksum: one of"):
        L3File(str(path), SLOTS, BPP, checksum="md5", overwrite=True)


@needs_xxhash
def test_a_replica_checks_with_the_writers_checksum_and_refuses_another(tmp_path: Path) -> None:
    with L3File(None, SLOTS, BPP, checksum=CRC32) as writer:
        page = write_slot(writer, 2, seed=5)
        where = share_path(*writer.share_handle())
        with L3File.open_replica(where, SLOTS, BPP) as replica:  # the file's algorithm
            assert replica.header.checksum == CRC32 and default_algorithm() == XXH3_LOW32
            replica.record(pages([2]), writer.checksums(pages([2])))
            assert read_slot(replica, 2).equal(page)
        with pytest.raises(StorageError, match=f"checksummed with {CRC32}, not {XXH3_LOW32}"):
            L3File.open_replica(where, SLOTS, BPP, checksum=XXH3_LOW32)


def test_without_xxhash_l3_falls_back_to_crc32_and_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A machine without the optional xxhash: new files use crc32; a file or a request for
    XXH3 is a typed error naming the algorithm and the package, never a crash."""
    with L3File(None, SLOTS, BPP) as writer:  # XXH3 where xxhash is installed
        monkeypatch.setitem(checksums._FUNCTIONS, XXH3_LOW32, None)  # now it is not
        assert default_algorithm() == CRC32
        with L3File(None, SLOTS, BPP) as f:
            assert f.header.checksum == CRC32 == decode(os.pread(f.fd, FIELDS_BYTES, 0)).checksum
            page = write_slot(f, 1, seed=3)
            assert f.checksum(1) == zlib.crc32(page.numpy().tobytes())
            assert read_slot(f, 1).equal(page)
        with pytest.raises(ConfigError, match="l3.checksum: 'xxh3-64-low32' needs the xxhash"):
            L3File(None, SLOTS, BPP, checksum=XXH3_LOW32)
        where = share_path(*writer.share_handle())
        if writer.header.checksum == XXH3_LOW32:
            with pytest.raises(StorageError, match=f"{XXH3_LOW32}, which this rank cannot") as e:
                L3File.open_replica(where, SLOTS, BPP)
            assert e.value.path == where


# -- one opener at a time (spec/l3.md, "Opening a path", rule 8) -------------------------------


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_file_another_l3_file_holds_is_refused_and_left_unchanged(
    tmp_path: Path, overwrite: bool
) -> None:
    """Seen failing before the lock: the second opener took the file over (truncated it, a
    new header) and the first's written slot failed its checksum from then on."""
    path = tmp_path / "l3.slots"
    with L3File(str(path), SLOTS, BPP) as first:
        page = write_slot(first, 3, seed=1)
        before = snapshot(path)
        with pytest.raises(L3InUse, match="in use") as info:
            L3File(str(path), SLOTS, BPP, overwrite=overwrite)
        assert isinstance(info.value, L3PathRefused) and not info.value.overwrite_helps
        assert info.value.path == str(path) and "close that controller" in str(info.value)
        assert snapshot(path) == before  # refused before anything changed
        assert read_slot(first, 3).equal(page)  # the holder still reads what it wrote
    with L3File(str(path), SLOTS, BPP) as again:  # closed: the lock went with it
        assert not again.written(pages([3])).any()


def test_a_replica_reads_a_held_file_without_being_refused(tmp_path: Path) -> None:
    """A tensor-parallel rank reads rank 0's file through /proc (open_replica): a reader,
    which takes no lock, so the writer's lock never refuses it."""
    with L3File(str(tmp_path / "l3.slots"), SLOTS, BPP) as writer:
        page = write_slot(writer, 2, seed=5)
        with L3File.open_replica(share_path(*writer.share_handle()), SLOTS, BPP) as replica:
            replica.record(pages([2]), writer.checksums(pages([2])))
            assert read_slot(replica, 2).equal(page)


def test_another_process_is_refused_until_the_holder_dies(tmp_path: Path) -> None:
    """The lock is the open file's, across processes; the OS drops it when the holder is
    killed, so a crashed server never blocks its successor."""
    path = tmp_path / "l3.slots"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from hicache.dataplane.storage import L3File; "
            f"f = L3File({str(path)!r}, {SLOTS}, {BPP}); print('open', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(L3InUse):
            L3File(str(path), SLOTS, BPP, overwrite=True)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    with L3File(str(path), SLOTS, BPP) as f:
        assert f.header == decode(l3_header_of(path))


def test_a_second_controller_on_a_live_l3_path_is_refused(tmp_path: Path) -> None:
    """Issue 30, section 5: a second controller on the l3_path a live one uses took the file
    over silently. It is refused with nothing changed; the first keeps serving from L3."""
    from hicache.controller.controller import CacheController

    cfg = CacheConfig(
        l1_pages=8, l2_pages=8, l3_slots=8, device="cpu", backend="torch",
        l3_path=str(tmp_path / "l3.slots"), l3_overwrite=True, write_policy="write_through",
    )  # fmt: skip
    first = CacheController(cfg)
    try:
        prompt = tuple(range(100, 109))
        first.admit(1, prompt)
        first.prefill(1)
        first.finish(1)
        first.drain()
        held = [n.value[2] for n in first.cp.tree.nodes() if n.value[2] is not None]
        assert held, "the prompt was backed up to L3"
        before = snapshot(tmp_path / "l3.slots")
        with pytest.raises(L3InUse, match="l3.slots"):
            CacheController(cfg)
        assert snapshot(tmp_path / "l3.slots") == before
        slots = np.concatenate(held)
        assert (first.byte_plane.digests("L3", slots) != UNSERVABLE).all()
    finally:
        first.close()
    CacheController(cfg).close()  # the first closed: its path is free again


# -- taking over ---------------------------------------------------------------------------------


def test_a_hicache_l3_file_is_reused_with_every_slot_empty(tmp_path: Path) -> None:
    path = tmp_path / "l3.slots"
    with L3File(str(path), SLOTS, BPP) as first:
        write_slot(first, 3, seed=1)
        assert first.written(pages([3])).all()
    inode = os.stat(path).st_ino
    tiny = preset("tiny")
    with L3File(str(path), 5, tiny.bytes_per_page, geometry=tiny) as again:
        assert not again.written(pages(range(5))).any()  # nothing from the first is trusted
        assert again.checksum(3) is None
        assert os.stat(path).st_ino == inode and os.stat(path).st_size == again.size_bytes
        assert decode(l3_header_of(path)) == L3Header(tiny.bytes_per_page, 5, tiny)
        assert path.read_bytes()[HEADER_BYTES:] == bytes(5 * tiny.bytes_per_page)  # old bytes gone
        again.check_identity()


def test_overwrite_replaces_a_foreign_file(text_file: Path) -> None:
    with L3File(str(text_file), SLOTS, BPP, overwrite=True) as f:
        st = os.stat(text_file)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == HEADER_BYTES + SLOTS * BPP
        data = text_file.read_bytes()
        assert decode(data) == f.header and data[HEADER_BYTES:] == bytes(SLOTS * BPP)
        f.check_identity()
    assert text_file.exists()  # an explicit file is the caller's: closing keeps it


def test_a_new_file_is_created_0600_with_a_header(tmp_path: Path) -> None:
    path = tmp_path / "new.slots"
    geometry = preset("tiny")
    with L3File(str(path), SLOTS, geometry.bytes_per_page, geometry=geometry) as f:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert os.stat(path).st_size == f.size_bytes == f.offset(SLOTS)
        assert decode(l3_header_of(path)) == L3Header(geometry.bytes_per_page, SLOTS, geometry)


# -- the header ---------------------------------------------------------------------------------


@pytest.mark.parametrize("geometry", [None, preset("qwen3-8b"), KVGeometry(3, 1, 8, "fp8", 2)])
def test_header_fields_round_trip(geometry: KVGeometry | None) -> None:
    bpp = geometry.bytes_per_page if geometry else BPP
    header = L3Header(bpp, 1 << 40, geometry)
    raw = encode(header)
    assert len(raw) == HEADER_BYTES and raw[FIELDS_BYTES:] == bytes(HEADER_BYTES - FIELDS_BYTES)
    assert decode(raw) == header
    # Read at the spec's offsets, not through the struct the code uses.
    assert raw[:8] == b"HICACHL3" and struct.unpack_from("<IIQQ", raw, 8) == (2, 4096, bpp, 1 << 40)
    shape = struct.unpack_from("<IIII", raw, 32)
    dtype = raw[48:56].rstrip(b"\0").decode()
    if geometry is None:
        assert shape == (0, 0, 0, 0) and dtype == ""
    else:
        g = geometry
        assert shape == (g.page_size, g.layers, g.kv_heads, g.head_dim) and dtype == g.dtype
    assert raw[56:72].rstrip(b"\0").decode() == header.checksum == default_algorithm()
    assert struct.unpack_from("<I", raw, 72)[0] == zlib.crc32(raw[:72])


def test_header_of_a_real_file_round_trips() -> None:
    geometry = preset("tiny")
    with L3File(None, SLOTS, geometry.bytes_per_page, geometry=geometry) as f:
        assert (
            decode(os.pread(f.fd, HEADER_BYTES, 0))
            == f.header
            == L3Header(geometry.bytes_per_page, SLOTS, geometry)
        )


def test_spec_table_is_the_header_layout() -> None:
    readme = SPEC_L3.read_text(encoding="utf-8")
    assert check_l3_header(readme) == []
    assert [f.offset + f.size for f in LAYOUT][-1] == HEADER_BYTES
    drifted = readme.replace("| 24 | 8 | `slots` |", "| 24 | 4 | `slots` |")
    (problem,) = check_l3_header(drifted)
    assert "l3.md line" in problem and "24 | 4 | slots" in problem


def test_bad_arguments_raise_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="l3.geometry"):
        L3File(None, SLOTS, BPP, geometry=preset("tiny"))
    with pytest.raises(ConfigError, match="l3.overwrite"):
        L3File(None, SLOTS, BPP, overwrite="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="l3.slots"):
        L3File(None, 1 << 62, BPP)
    with pytest.raises(ConfigError, match="l3_overwrite"):
        CacheConfig(l3_overwrite=1)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# -- slots at their offsets ------------------------------------------------------------------


def test_slot_bytes_live_after_the_header(tmp_path: Path) -> None:
    path = tmp_path / "l3.slots"
    with L3File(str(path), SLOTS, BPP) as f:
        page = write_slot(f, 5, seed=2)
        on_disk = np.frombuffer(path.read_bytes(), dtype=np.uint8)
        assert f.offset(5) == HEADER_BYTES + 5 * BPP
        assert np.array_equal(on_disk[f.offset(5) : f.offset(6)], page.numpy())
        assert not on_disk[HEADER_BYTES : f.offset(5)].any() and not on_disk[f.offset(6) :].any()
        assert decode(on_disk[:HEADER_BYTES].tobytes()) == f.header  # the header is intact


def test_engine_refuses_a_text_file_and_overwrites_only_when_told(text_file: Path) -> None:
    geometry = preset("tiny")
    before = snapshot(text_file)
    with pytest.raises(L3PathRefused):
        TransferEngine(
            one_pool(geometry), 4, 4, 4, device="cpu", backend="torch", l3_path=str(text_file)
        )
    assert snapshot(text_file) == before
    with TransferEngine(
        one_pool(geometry),
        4,
        4,
        4,
        device="cpu",
        backend="torch",
        l3_path=str(text_file),
        l3_overwrite=True,
    ) as engine:
        assert decode(l3_header_of(text_file)) == L3Header(geometry.bytes_per_page, 4, geometry)
        raw = engine.l2.bytes_view()
        raw[1] = torch.arange(raw.shape[1], dtype=torch.int64).remainder(251).to(torch.uint8)
        assert engine.h2s(pages([1]), pages([2])).wait(timeout_s=10) is TransferStatus.DONE
        assert engine.digests("L3", pages([2]))[0] == engine.digests("L2", pages([1]))[0]


# -- the demo -----------------------------------------------------------------------------------


def test_demo_refuses_an_existing_text_file(
    text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(text_file)
    assert demo.main(["--quiet", "--requests", "1", "--l3-path", str(text_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hicache demo: --l3-path ")
    assert str(text_file) in err and "--l3-overwrite" in err
    assert snapshot(text_file) == before


def test_demo_refuses_a_symlink_even_with_overwrite(
    tmp_path: Path, text_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "l3.slots"
    link.symlink_to(text_file)
    before = snapshot(text_file)
    args = ["--quiet", "--requests", "1", "--l3-path", str(link), "--l3-overwrite"]
    assert demo.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symbolic link" in err and "--l3-overwrite" not in err
    assert snapshot(text_file) == before


def test_demo_help_says_what_happens_to_an_existing_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        demo.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "is refused and left unchanged" in text and "symlink is never followed" in text
    assert "--l3-overwrite" in text and "its slots start empty" in text


def test_storage_error_still_names_a_missing_directory(tmp_path: Path) -> None:
    bad = tmp_path / "missing" / "l3.slots"
    with pytest.raises(StorageError, match="directory does not exist") as info:
        L3File(str(bad), SLOTS, BPP)
    assert not isinstance(info.value, L3PathRefused) and info.value.path == str(bad)
