"""The L3 file's header: what makes a file recognisably hicache's, and what it was made for.

    file offset   0        4096     4096 + B          4096 + s*B        4096 + slots*B
                  | header | slot 0 | slot 1 | ...   | slot s | ...    |
    B = bytes_per_page; the header is HEADER_BYTES = 4096 bytes, so slots stay 4 KiB aligned
    whenever B is a multiple of 4096 (every preset but `tiny`).

`LAYOUT` is the header (spec/l3.md, "Layout", is a checked copy: `hicache spec check`);
integers are unsigned little-endian and the bytes after the last field are zero. The header
records the geometry the file was sized for and the slot count, never which slots hold a
page: that metadata lives only in the process that wrote the slots (`storage.py`).

`decode` decides whether bytes read from the start of a file are a header this code wrote:
the magic, then the header checksum, then the version. Anything else is refused by the
opener (unless the caller said to overwrite it), so a file that is not ours is never taken
for one. The header also names the slot checksum its pages are written with (`checksums.py`);
the opener refuses a file of another algorithm (`storage.py`), so no slot is ever checked with
the wrong one. Version 1 had no such field (crc32 was implied).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

from hicache.dataplane.checksums import NAME_BYTES, default_algorithm
from hicache.dataplane.geometry import KVGeometry
from hicache.errors import ConfigError

MAGIC = b"HICACHL3"
VERSION = 2
HEADER_BYTES = 4096  # slot 0 starts here; a multiple of the page and sector size


class HeaderField(NamedTuple):
    offset: int
    size: int
    name: str
    code: str  # struct code of the field
    meaning: str


HEADER_FIELDS: tuple[HeaderField, ...] = (
    HeaderField(0, 8, "magic", "8s", "ASCII `HICACHL3`: a hicache L3 file"),
    HeaderField(8, 4, "version", "I", "format version; this layout is version 2"),
    HeaderField(12, 4, "header_bytes", "I", "4096: where slot 0 starts"),
    HeaderField(16, 8, "bytes_per_page", "Q", "B: bytes of one slot"),
    HeaderField(24, 8, "slots", "Q", "number of slots"),
    HeaderField(32, 4, "page_size", "I", "tokens per page; 0 when no geometry is recorded"),
    HeaderField(36, 4, "layers", "I", "layers; 0 when no geometry is recorded"),
    HeaderField(40, 4, "kv_heads", "I", "KV heads; 0 when no geometry is recorded"),
    HeaderField(44, 4, "head_dim", "I", "head dimension; 0 when no geometry is recorded"),
    HeaderField(48, 8, "dtype", "8s", "ASCII dtype name, NUL-padded (`bf16`); empty: none"),
    HeaderField(
        56, NAME_BYTES, "checksum", f"{NAME_BYTES}s", "ASCII slot checksum name, NUL-padded"
    ),
    HeaderField(72, 4, "header_crc32", "I", "zlib crc32 of bytes 0-71"),
)
_STRUCT = struct.Struct("<" + "".join(f.code for f in HEADER_FIELDS))
FIELDS_BYTES = _STRUCT.size  # 76: what `decode` needs; the rest of the header is zero
_CRC_AT = HEADER_FIELDS[-1].offset

# Verify the table is the struct's layout: fields back to back, the checksum last.
assert all(a.offset + a.size == b.offset for a, b in pairwise(HEADER_FIELDS))
assert FIELDS_BYTES == _CRC_AT + 4 and FIELDS_BYTES <= HEADER_BYTES

# The whole header as spec/l3.md tabulates it: the fields, then zeros up to slot 0.
LAYOUT = HEADER_FIELDS + (
    HeaderField(
        FIELDS_BYTES, HEADER_BYTES - FIELDS_BYTES, "reserved", "x", "zero bytes up to slot 0"
    ),
)


@dataclass(frozen=True)
class L3Header:
    """What one L3 file was made for. `geometry`: None when only bytes_per_page is known;
    `checksum`: the slot checksum's name (`checksums.py`), by default this process's fastest."""

    bytes_per_page: int
    slots: int
    geometry: KVGeometry | None = None
    version: int = VERSION
    checksum: str = field(default_factory=default_algorithm)


def encode(header: L3Header) -> bytes:
    """The whole header block: HEADER_BYTES bytes, fields first, then zeros."""
    g = header.geometry
    shape = (g.page_size, g.layers, g.kv_heads, g.head_dim) if g else (0, 0, 0, 0)
    dtype = g.dtype.encode("ascii") if g else b""
    fields = (
        MAGIC,
        header.version,
        HEADER_BYTES,
        header.bytes_per_page,
        header.slots,
        *shape,
        dtype,
        header.checksum.encode("ascii"),
    )
    head = _STRUCT.pack(*fields, 0)[:_CRC_AT]
    return (head + struct.pack("<I", zlib.crc32(head))).ljust(HEADER_BYTES, b"\0")


def decode(raw: bytes) -> L3Header:
    """The header at the start of `raw` (at least FIELDS_BYTES bytes read from offset 0).

    ValueError saying why `raw` is not a header this version wrote, in words that follow
    "the file ..." (not a hicache L3 file; truncated; damaged; another version)."""
    if not raw.startswith(MAGIC):
        raise ValueError(f"is not a hicache L3 file (it does not begin with {MAGIC.decode()})")
    if len(raw) < FIELDS_BYTES:
        raise ValueError(f"has a truncated hicache L3 header ({len(raw)} of {FIELDS_BYTES} bytes)")
    version = struct.unpack_from("<I", raw, 8)[0]
    if version != VERSION:  # before the checksum: another version's fields lie elsewhere
        why = f"is a hicache L3 file of format version {version}"
        raise ValueError(f"{why}; this hicache reads version {VERSION}")
    _, _, header_bytes, bpp, slots, *shape, dtype, checksum, crc = _STRUCT.unpack_from(raw)
    if zlib.crc32(raw[:_CRC_AT]) != crc:
        raise ValueError("has a damaged hicache L3 header (its checksum does not match)")
    if header_bytes != HEADER_BYTES:
        raise ValueError(
            f"is a hicache L3 file of format version {version} ({header_bytes}-byte header); "
            f"this hicache reads version {VERSION}"
        )
    try:
        name = checksum.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise ValueError(f"has a hicache L3 header naming no checksum ({checksum!r})") from None
    return L3Header(bpp, slots, _geometry(shape, dtype, bpp), version, name)


def _geometry(shape: list[int], dtype: bytes, bytes_per_page: int) -> KVGeometry | None:
    if shape == [0, 0, 0, 0] and dtype.rstrip(b"\0") == b"":
        return None
    page_size, layers, kv_heads, head_dim = shape
    try:
        g = KVGeometry(layers, kv_heads, head_dim, dtype.rstrip(b"\0").decode("ascii"), page_size)
    except (ConfigError, UnicodeDecodeError) as e:
        raise ValueError(f"has a hicache L3 header with an impossible geometry ({e})") from None
    if g.bytes_per_page != bytes_per_page:
        raise ValueError(
            f"has a hicache L3 header whose geometry ({g.bytes_per_page} bytes/page) "
            f"disagrees with its bytes_per_page ({bytes_per_page})"
        )
    return g
