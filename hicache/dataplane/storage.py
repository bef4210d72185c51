"""The L3 tier: one local file of fixed slots after a header, and its in-memory metadata
(the format is spec/l3.md).

    file offset   0        H        H + B    H + 2B           H + s*B          H + slots*B
                  | header | slot 0 | slot 1 | ...            | slot s | ...   |
    H = HEADER_BYTES (4096), B = bytes_per_page; slot s lives at H + s*B, computed, never
    allocated. The header (`l3format.py`) says the file is hicache's, and for what geometry.

The file is sized once at start (`ftruncate`, then `posix_fallocate` so that a full disk shows
up here, not halfway through a backup). Its metadata -- which slots hold a written page, and
each slot's checksum -- lives only in this process: a file opened again, by this process or
another, starts with every slot empty (it is truncated to its new header when taken over),
so bytes left by an earlier process are never trusted. An existing path is taken over only
when it is already a hicache L3 file, or when the caller says to overwrite it; a symlink never
is, nor a file another open `L3File` holds (see `L3File`): an explicit path is locked
(`flock`, exclusive) for as long as it is open, so two controllers never share one file.

Checksum: 32 bits of the whole page, 4 bytes of metadata per slot (spec/l3.md, "Slot
metadata and the checksum", says when it is recorded and checked), computed with the file's
algorithm (`checksums.py`: XXH3 where `xxhash` is installed, else zlib's crc32), which the
header names. Every algorithm releases the GIL on a page, so `storage_io.py` runs it on the
I/O threads beside the file I/O. A file whose header names another algorithm than this
`L3File`'s is refused (a takeover: `L3PathRefused`; a replica: `StorageError`), never read
with the wrong one.

Thread safety: the metadata is changed (`record`, `invalidate`) by the thread that issues and
observes transfers; I/O threads only read it (`verify`), and the corrupt-read counter is locked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
from dataclasses import replace as _replace
from types import TracebackType

import numpy as np
import numpy.typing as npt

from hicache.core.pages import Pages
from hicache.dataplane.checksums import PageChecksum, checksum_function, default_algorithm
from hicache.dataplane.geometry import KVGeometry
from hicache.dataplane.l3format import FIELDS_BYTES, HEADER_BYTES, L3Header, decode, encode
from hicache.errors import (
    ConfigError,
    CorruptSlot,
    InvalidPages,
    L3InUse,
    L3PathRefused,
    StorageError,
)

MAX_FILE_BYTES = (1 << 63) - 1  # off_t: the largest file offset the OS can address


class L3File:
    """`slots` fixed slots of `bytes_per_page` bytes each in one file, plus their checksums.

    Every file starts with a header (`l3format.py`: magic, version, `geometry` when given,
    bytes_per_page, slots); slot s lives at `offset(s)`, after it. Slot metadata is this
    process's alone: every slot starts empty, whatever the file held before.

    `path=None`: a temporary file (mode 0600) whose name is removed as soon as it is created:
    the descriptor keeps it, and the kernel frees its space when the descriptor closes --
    on `close()`, at exit, or when the process is killed (SIGKILL, the OOM killer), so a
    crashed server never leaves gigabytes behind. `path` then names where it was, for
    messages.

    An explicit `path` (its directories may be symlinks, its last component may not):

    - held by another open `L3File` (a live controller, in this process or another):
      refused with `L3InUse`, even with `overwrite` -- the descriptor holds an exclusive
      advisory lock (`flock`) on the file from the moment it is opened until it closes
      (the OS drops it when the process dies), taken before anything else is decided;
    - missing: created exclusively (O_CREAT|O_EXCL, mode 0600);
    - a hicache L3 file (magic, header checksum and version valid): taken over -- mode set
      to 0600, truncated, a new header for this geometry and slot count written, resized;
    - any other regular file: refused, unless `overwrite` -- then taken over the same way;
    - a symlink (never followed: O_NOFOLLOW, even with `overwrite`), a directory, FIFO,
      device or socket: refused.

    The decision is made on the opened descriptor (fstat, then the header read from it), so
    the name cannot be swapped between check and use. A refused path is left exactly as it
    was -- bytes, mode, a symlink's target -- and raises `L3PathRefused` (a StorageError;
    `L3InUse` for a held file) saying why and what to do. Other failures raise
    `StorageError` naming the path; non-positive sizes or a geometry of another
    bytes_per_page raise `ConfigError`.

    `checksum`: the slot checksum's name (`checksums.py`); None: this process's fastest. An
    existing hicache L3 file whose header names another one is refused like a file that is not
    ours (`L3PathRefused` naming both, unless `overwrite`); one this process cannot compute is
    a ConfigError. `page_checksum(data)` is the file's checksum of one page's bytes.

    `direct`: the movers' I/O bypasses the page cache (`O_DIRECT`, Linux), for real storage
    where the cache would only double-buffer the L2 pool. It goes through `io_fd`, a second
    descriptor of the same open file; `fd` (the header, digests, faults' byte flips, replicas)
    stays buffered, which the kernel keeps coherent with direct I/O. Direct I/O moves whole
    `DIRECT_ALIGN` blocks between aligned memory and aligned offsets: bytes_per_page must be
    a multiple of it (ConfigError otherwise; slots then start aligned, after the 4 KiB
    header), and the mover checks its L2 memory (`aligned_pages` allocates such). A file
    system that refuses O_DIRECT is a StorageError naming the path, at open. (Injected short
    I/O faults cut unaligned slivers, which direct I/O refuses: EINVAL, a failed transfer.)
    """

    def __init__(
        self,
        path: str | None,
        slots: int,
        bytes_per_page: int,
        *,
        geometry: KVGeometry | None = None,
        overwrite: bool = False,
        checksum: str | None = None,
        direct: bool = False,
    ) -> None:
        _check_config(slots, bytes_per_page, geometry, overwrite)
        _check_direct(direct, bytes_per_page)
        self.direct = direct
        self._io_fd = -1  # the O_DIRECT descriptor, once opened
        checksum = default_algorithm() if checksum is None else checksum
        self.page_checksum = checksum_function(checksum)
        self.slots = slots
        self.bytes_per_page = bytes_per_page
        self.header = L3Header(bytes_per_page, slots, geometry, checksum=checksum)
        self.size_bytes = HEADER_BYTES + slots * bytes_per_page  # the file: header and slots
        self.temporary = path is None
        self.path, self._fd = (
            _open_temp() if path is None else _open_explicit(path, overwrite, checksum)
        )
        try:
            self._write_header()
            self._size_file()
            st = os.fstat(self._fd)
            if direct:
                self._io_fd = _open_direct(self.path, self._fd)
        except BaseException:
            self._close_fd_and_temp()
            raise
        self._identity = (st.st_dev, st.st_ino)
        self.replica = False  # this process's own file (see `open_replica`)
        self._fresh_metadata()

    def _fresh_metadata(self) -> None:
        # R47: slot metadata lives only here, in memory: every open starts with no slot written.
        self._crc: npt.NDArray[np.uint32] = np.zeros(self.slots, dtype=np.uint32)
        self._written: npt.NDArray[np.bool_] = np.zeros(self.slots, dtype=np.bool_)
        self._counter_lock = threading.Lock()
        self.corrupt_reads = 0  # reads whose bytes failed the slot's checksum (never served)

    @classmethod
    def open_replica(
        cls,
        path: str,
        slots: int,
        bytes_per_page: int,
        *,
        geometry: KVGeometry | None = None,
        checksum: str | None = None,
    ) -> L3File:
        """Another rank's L3 file, opened to read what that rank writes into it: a
        replicated pool's slots, which rank 0 alone writes, under a key without a rank, and
        every rank reads (spec/tp.md, "L3 writes"). `path` names the writer's open file --
        `share_path(*writer.share_handle())`, `/proc/<pid>/fd/<fd>`, which reaches it even
        though its name was removed -- and it must hold a header for exactly these slots
        and this geometry (StorageError naming the path otherwise). The replica checks with
        the algorithm the file's header names (the writer's: its checksums arrive in it);
        `checksum`, when given, must be that one. StorageError naming the path and the
        algorithm when it is another, or one this process cannot compute.

        Nothing in the file is changed, and no lock is taken: the writer holds the file
        (a temporary one, which no `l3_path` can name), the replica only reads it. Its
        metadata starts empty and holds only what
        `record` is told: the writer's checksums of the slots it wrote (C6b), never anything
        read from the file. The replica's own writes would race the writer's, so its mover
        never writes through it (`GroupStorageMover`); a CORRUPT_SLOT fault may still flip
        a byte of the shared copy, as a storage fault every reader then meets."""
        _check_config(slots, bytes_per_page, geometry, False)
        self = cls.__new__(cls)
        self.slots, self.bytes_per_page = slots, bytes_per_page
        self.header = L3Header(bytes_per_page, slots, geometry)  # its checksum: the file's
        self.size_bytes = HEADER_BYTES + slots * bytes_per_page
        self.temporary = True  # no name of its own to check: the writer's is removed
        self.path, self.replica = path, True
        self.direct, self._io_fd = False, -1  # a replica reads through the page cache
        try:  # a /proc magic link is followed on purpose: it names the writer's open file
            self._fd = os.open(path, os.O_RDWR | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise StorageError(
                path,
                f"cannot open rank 0's L3 file to read it: "
                f"{describe_os_error(e)}; every rank of a tensor-parallel "
                "group must run on one host",
            ) from e
        try:
            st = os.fstat(self._fd)
            got = decode(os.pread(self._fd, FIELDS_BYTES, 0))
            self.header = _replace(self.header, checksum=got.checksum)
            if got != self.header or st.st_size < self.size_bytes:
                raise StorageError(
                    path,
                    f"holds {got} in {st.st_size} bytes, not {self.header} "
                    f"in {self.size_bytes}: the ranks' L3 geometries differ",
                )
            self.page_checksum = _replica_checksum(path, got.checksum, checksum)
        except (OSError, ValueError) as e:
            os.close(self._fd)
            raise StorageError(path, f"is not rank 0's L3 file: {e}") from e
        except BaseException:
            os.close(self._fd)
            raise
        self._identity = (st.st_dev, st.st_ino)
        self._fresh_metadata()
        return self

    def share_handle(self) -> tuple[int, int]:
        """(process id, descriptor): what another process of this host passes to
        `share_path` to reach this open file (`open_replica`), valid while this process
        holds it open. ConfigError where /proc is missing."""
        if not os.path.isdir("/proc/self/fd"):
            raise ConfigError(
                "l3",
                "sharing an L3 file between ranks needs Linux's /proc "
                "(/proc/<pid>/fd); run the group's ranks on Linux",
            )
        return os.getpid(), self.fd

    # -- the file ---------------------------------------------------------------------------

    @property
    def fd(self) -> int:
        """The open descriptor (for `os.pwrite` / `os.preadv`). StorageError once closed."""
        if self._fd < 0:
            raise StorageError(self.path, "closed; open a new L3File")
        return self._fd

    @property
    def io_fd(self) -> int:
        """The descriptor the movers read and write slots through: `fd`, or with `direct` a
        second one opened O_DIRECT. StorageError once closed."""
        fd = self.fd
        return self._io_fd if self._io_fd >= 0 else fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def offset(self, slot: int) -> int:
        """Byte offset of `slot` in the file: after the header, HEADER_BYTES + slot * B (R46)."""
        return HEADER_BYTES + slot * self.bytes_per_page

    def check_identity(self) -> None:
        """StorageError if the path no longer names the file we opened (deleted, replaced,
        renamed over): R52, L3 then goes offline. One `stat` call; run once per transfer
        batch, not per extent. A temporary file has no name left to check: no other process
        can reach it."""
        fd = self.fd
        if self.temporary:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise StorageError(self.path, "removed under us; its slots are lost (R52)") from None
        if (st.st_dev, st.st_ino) != self._identity:
            why = f"replaced under us (fd {fd} is another file); its slots are lost (R52)"
            raise StorageError(self.path, why)

    def check_slots(self, slots: Pages, field: str) -> None:
        """InvalidPages naming `field` unless every slot is in [0, slots)."""
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= self.slots):
            raise InvalidPages(field, f"slot out of range [0, {self.slots}) in {slots.tolist()}")

    def _write_header(self) -> None:
        """Drop whatever the file held (its slots are not trusted), then write our header.
        Before sizing (R48): a file cut short by a crash while sizing is still recognisably ours."""
        blob = encode(self.header)
        try:
            os.ftruncate(self._fd, 0)
            wrote = os.pwrite(self._fd, blob, 0)
        except OSError as e:
            raise StorageError(self.path, f"cannot write its header: {describe_os_error(e)}") from e
        if wrote != len(blob):
            raise StorageError(self.path, f"header write stopped at {wrote} of {len(blob)} bytes")

    def _size_file(self) -> None:
        try:
            os.ftruncate(self._fd, self.size_bytes)
        except OSError as e:
            why = f"cannot size to {self.size_bytes} bytes: {describe_os_error(e)}"
            raise StorageError(self.path, why) from e
        # Why fallocate: a full disk should fail here, at start, not in the middle of a backup.
        # Filesystems without it (EOPNOTSUPP/EINVAL) get ENOSPC later, from pwrite, as a
        # TransferError naming the path.
        if not hasattr(os, "posix_fallocate"):
            return
        try:
            os.posix_fallocate(self._fd, 0, self.size_bytes)
        except OSError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                return
            why = f"cannot reserve {self.size_bytes} bytes: {describe_os_error(e)}"
            raise StorageError(self.path, f"{why}; free space or use fewer slots") from e

    # -- metadata ---------------------------------------------------------------------------

    def written(self, slots: Pages) -> npt.NDArray[np.bool_]:
        """Per slot: does it hold a completely written, checksummed page?"""
        return self._written[slots].copy()

    def checksum(self, slot: int) -> int | None:
        """The recorded checksum of `slot`, or None if it holds no written page."""
        return int(self._crc[slot]) if self._written[slot] else None

    def checksums(self, slots: Pages) -> npt.NDArray[np.uint32]:
        """The recorded checksums of `slots`, every one of which holds a written page."""
        # Verify each slot was written: an unwritten slot's checksum means nothing.
        assert self._written[slots].all(), slots[~self._written[slots]].tolist()
        return self._crc[slots].copy()

    def invalidate(self, slots: Pages) -> None:
        """Forget these slots' pages (a write into them is starting, or failed): R53."""
        self._written[slots] = False

    def record(self, slots: Pages, checksums: npt.NDArray[np.uint32]) -> None:
        """After a successful write: these slots hold pages with these checksums."""
        # Verify one checksum per slot: a misaligned pair would fail (or pass) later reads.
        assert slots.shape == checksums.shape, (slots.shape, checksums.shape)
        self._crc[slots] = checksums
        self._written[slots] = True

    def verify(self, slot: int, data: memoryview) -> None:
        """Check `data` (bytes just read from `slot`) against the slot's checksum.

        Raises CorruptSlot (and counts it in `corrupt_reads`) on a mismatch, or when the slot
        holds no written page: such bytes are never served (R53). Safe to call from I/O threads.
        """
        if self._written[slot] and self.page_checksum(data) == int(self._crc[slot]):
            return
        with self._counter_lock:
            self.corrupt_reads += 1
        raise CorruptSlot(slot, self.path)

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the file; a temporary one is removed. Idempotent."""
        if self._fd >= 0:
            self._close_fd_and_temp()

    def _close_fd_and_temp(self) -> None:
        if self._io_fd >= 0:
            io_fd, self._io_fd = self._io_fd, -1
            os.close(io_fd)
        fd, self._fd = self._fd, -1
        os.close(fd)  # a temporary file's space is freed here: its name is already gone

    def __enter__(self) -> L3File:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "L3File.replica" if self.replica else "L3File"
        return f"{kind}({self.path!r}, slots={self.slots}, bytes_per_page={self.bytes_per_page})"


def _replica_checksum(path: str, written: str, asked: str | None) -> PageChecksum:
    """The checksum a replica of a file written with `written` checks with: that one.
    StorageError naming both when `asked` is another, or when this process lacks it."""
    if asked is not None and asked != written:
        why = f"its slots are checksummed with {written}, not {asked}"
        raise StorageError(path, f"{why}: every rank must use one L3 checksum")
    try:
        return checksum_function(written)
    except ConfigError as e:
        why = f"its slots are checksummed with {written}, which this rank cannot compute ({e})"
        raise StorageError(path, f"{why}: install the same hicache extras on every rank") from e


DIRECT_ALIGN = 4096  # O_DIRECT: memory, offsets and lengths in multiples of this (any disk's)


def _check_direct(direct: bool, bytes_per_page: int) -> None:
    """ConfigError unless `direct` is a bool this platform and page size can honour."""
    if not isinstance(direct, bool):
        raise ConfigError("l3.direct", f"must be True or False, got {direct!r}")
    if not direct:
        return
    if not hasattr(os, "O_DIRECT"):
        raise ConfigError("l3.direct", "O_DIRECT is Linux's; turn direct I/O off here")
    if bytes_per_page % DIRECT_ALIGN:
        why = (
            f"O_DIRECT moves whole {DIRECT_ALIGN}-byte blocks, and a page of {bytes_per_page} "
            "bytes is not a multiple of that; turn direct I/O off for this geometry"
        )
        raise ConfigError("l3.direct", why)


def _open_direct(path: str, fd: int) -> int:
    """A second descriptor of open file `fd`, with O_DIRECT: reopened through /proc, so it
    is the same file even when its name was removed or replaced. StorageError naming `path`
    when the file system refuses direct I/O (EINVAL: tmpfs before Linux 6.6, some FUSE)."""
    flags = os.O_RDWR | os.O_DIRECT | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(f"/proc/self/fd/{fd}", flags)
    except OSError as e:
        why = f"cannot open it for direct I/O (O_DIRECT): {describe_os_error(e)}"
        if e.errno == errno.EINVAL:
            why += "; its file system refuses O_DIRECT (tmpfs does before Linux 6.6)"
        raise StorageError(path, f"{why}; put it on a disk file system, or turn direct off") from e


def share_path(pid: int, fd: int) -> str:
    """The path through which another process reaches open file `fd` of process `pid`."""
    return f"/proc/{pid}/fd/{fd}"


def _open_temp() -> tuple[str, int]:
    """mkstemp (created 0600, O_EXCL), then unlinked at once: only the descriptor holds it."""
    try:
        fd, path = tempfile.mkstemp(prefix="hicache-l3-", suffix=".slots")
    except OSError as e:
        where = tempfile.gettempdir()
        why = f"cannot create a temporary L3 file: {describe_os_error(e)}; set TMPDIR"
        raise StorageError(where, why) from e
    try:
        os.unlink(path)
    except OSError as e:
        os.close(fd)
        raise StorageError(
            path, f"cannot unlink the new temporary L3 file: {describe_os_error(e)}"
        ) from e
    return path, fd


_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


def _open_explicit(path: str, overwrite: bool, checksum: str) -> tuple[str, int]:
    """Create `path` exclusively, or open what is there; lock it (`_lock`), then decide from
    the descriptor whether L3 may take it over (see `L3File`). Returns the absolute path and
    a locked descriptor of a regular file, mode 0600; nothing in the file is changed yet."""
    path = os.path.abspath(path)
    try:
        fd = os.open(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o600)  # R48
    except FileExistsError:
        fd = -1  # something is there (a file, a symlink, dangling or not): look at it below
    except OSError as e:
        raise _cannot_open(path, "create", e) from e
    created = fd >= 0
    if not created:
        fd = _open_existing(path)
    try:
        # Lock first: a file another L3File holds is refused before anything is decided. A
        # file created here and taken over by another opener before this lock (it found it
        # empty, with overwrite) is that opener's now: refused too, and left to it.
        _lock(path, fd)
        if not created:
            _check_takeover(path, fd, overwrite, checksum)
            os.fchmod(fd, 0o600)  # an existing file keeps its mode under open(); data is ours
    except OSError as e:
        os.close(fd)
        raise StorageError(path, f"cannot set mode 0600: {describe_os_error(e)}") from e
    except BaseException:
        os.close(fd)
        raise
    return path, fd


def _lock(path: str, fd: int) -> None:
    """Take an exclusive advisory lock on the open file `fd` for as long as it is open
    (spec/l3.md, "Opening a path", rule 8; R51). `flock`, not `fcntl`/`lockf` record locks: those
    belong to the process, so a second controller in the same process would get the lock
    too, and closing any descriptor of the file would drop it. L3InUse when another open
    file description holds it; StorageError when the file system cannot lock."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise L3InUse(path) from None
    except OSError as e:
        why = f"cannot lock it: {describe_os_error(e)}; put l3_path on a local file system"
        raise StorageError(path, why) from e


def _open_existing(path: str) -> int:
    """A descriptor of the regular file at `path` (the name itself, never a symlink's target).
    O_NONBLOCK: opening a FIFO must not wait for a writer before it is refused."""
    try:
        fd = os.open(path, _OPEN_FLAGS | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ELOOP and os.path.islink(path):
            why = "is a symbolic link; L3 never follows one, not even to overwrite it (R49)"
            raise L3PathRefused(path, why, overwrite_helps=False) from None
        if e.errno in (errno.EISDIR, errno.ENXIO):  # a directory; a socket
            raise _not_regular(path) from None
        raise _cannot_open(path, "open", e) from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _not_regular(path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_takeover(path: str, fd: int, overwrite: bool, checksum: str) -> None:
    """L3PathRefused unless the open regular file `fd` holds a hicache L3 header naming
    slot checksum `checksum`, or `overwrite`: R50, decided on the descriptor. Reads the
    header's fields; writes nothing."""
    try:
        raw = os.pread(fd, FIELDS_BYTES, 0)
    except OSError as e:
        raise StorageError(path, f"cannot read its header: {describe_os_error(e)}") from e
    if overwrite:
        return
    try:
        written = decode(raw).checksum
    except ValueError as e:
        raise L3PathRefused(path, f"exists and {e} (R50)", overwrite_helps=True) from None
    if written != checksum:
        why = (
            f"exists and is a hicache L3 file whose slots are checksummed with {written}, "
            f"not {checksum} (this L3 file's checksum)"
        )
        raise L3PathRefused(path, why, overwrite_helps=True)


def _not_regular(path: str) -> L3PathRefused:
    why = "is not a regular file (a directory, FIFO, device or socket); L3 needs a file path (R49)"
    return L3PathRefused(path, why, overwrite_helps=False)


def _cannot_open(path: str, what: str, e: OSError) -> StorageError:
    hint = "check permissions"
    if e.errno == errno.ENOENT:  # creating: no directory; opening: removed since the create
        hint = "the directory does not exist" if what == "create" else "removed meanwhile; retry"
    return StorageError(path, f"cannot {what} for writing: {describe_os_error(e)}; {hint}")


def _check_config(
    slots: int, bytes_per_page: int, geometry: KVGeometry | None, overwrite: bool
) -> None:
    """ConfigError naming the first bad argument of `L3File`."""
    if not isinstance(slots, int) or slots <= 0:
        raise ConfigError("l3.slots", f"must be a positive integer, got {slots!r}")
    if not isinstance(bytes_per_page, int) or bytes_per_page <= 0:
        raise ConfigError(
            "l3.bytes_per_page", f"must be a positive integer, got {bytes_per_page!r}"
        )
    if HEADER_BYTES + slots * bytes_per_page > MAX_FILE_BYTES:
        why = f"{slots} slots of {bytes_per_page} bytes exceed the largest file offset"
        raise ConfigError("l3.slots", why)
    if geometry is not None and geometry.bytes_per_page != bytes_per_page:
        why = f"{geometry.bytes_per_page} bytes per page, the L3 file's is {bytes_per_page}"
        raise ConfigError("l3.geometry", why)
    if not isinstance(overwrite, bool):
        raise ConfigError("l3.overwrite", f"must be True or False, got {overwrite!r}")


def describe_os_error(e: OSError) -> str:
    """'ENOSPC (No space left on device)' -- errno name and text, for messages."""
    name = errno.errorcode.get(e.errno, str(e.errno)) if e.errno is not None else "no errno"
    return f"{name} ({e.strerror})"
