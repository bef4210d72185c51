"""vLLM's tiering manager with its file tier, built as vLLM builds it, for vllm_tiering.py.

`open_tiering` builds the scheduler-side manager with vLLM's own factory,
`TieringOffloadingSpec(OffloadingConfig(...)).get_manager()`: a `TieringOffloadingManager`
over a `CPUPrimaryTierOffloadingManager` (L2, `l2_pages` chunks in a `SharedOffloadRegion`
under /dev/shm, one 4096-byte chunk per page) and one `FileSystemTierManager` (L3, a block
file per page under a temporary `root_dir`). The file tier is asked for no I/O threads and
its two threads are replaced by vllm_fs.py's players, so every file job and probe runs when
the adapter says. `FileTier` is that engine as the adapter holds it:

    member      what it is
    ----------  ------------------------------------------------------------------------
    manager     the TieringOffloadingManager (the connector calls it; vllm.py drives it)
    fs          its FileSystemTierManager (tier index 0)
    jobs        the FileJobPlayer in fs._pool: file jobs queued until played
    probes      the LookupPlayer over fs._lookup_manager: settled after on_schedule_end
    root        the temporary root_dir, removed by `close`

`l3_view` is what the file tier holds by the adapter's page names: RESIDENT for a block whose
file exists (whatever its length: a cut file is still there until a read finds it short),
PENDING for one a queued store job is writing. `damage` cuts or removes every block file.
"""

from __future__ import annotations

import glob
import importlib
import itertools
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hicache.testing.adapters.engine_path import engine_import_path
from hicache.testing.adapters.sglang_import import EngineUnavailable
from hicache.testing.adapters.vllm_fs import STORE, FileJobPlayer, LookupPlayer
from hicache.testing.protocol import PENDING

RESIDENT = "RESIDENT"
CHUNK_BYTES = 4096
"""Bytes of one offloaded chunk (one page): the shared region's alignment, its smallest."""
TRUNCATED_BYTES = 3  # what `damage("truncate")` leaves of a block file
_opened = itertools.count()  # engine ids: one /dev/shm region per opened engine


@dataclass(eq=False)
class FileTier:
    """The tiering manager and its file tier's seams (module docstring)."""

    manager: Any
    fs: Any
    jobs: FileJobPlayer
    probes: LookupPlayer
    root: str

    def file(self, key: Any) -> str:
        """The block file of an OffloadKey (the tier's own FileMapper names it)."""
        return str(self.fs.file_mapper.get_file_name(key))

    def files(self) -> list[str]:
        """Every block file under the root now."""
        return glob.glob(os.path.join(self.root, "**", "*.bin"), recursive=True)

    def writing(self) -> set[Any]:
        """The keys queued store jobs are writing (the tier's cascades in flight)."""
        jobs = self.manager._jobs
        return {
            key
            for job_id, job in self.jobs.queued.items()
            if job.kind == STORE and job_id in jobs
            for key in jobs[job_id].transfer_job.keys
        }

    def l3_view(self, pages: Mapping[Any, tuple[int, ...]]) -> dict[tuple[int, ...], str]:
        """The file tier's pages, for `pages` (OffloadKey -> the page's token prefix)."""
        writing = self.writing()
        view = {}
        for key, prefix in pages.items():
            if os.path.exists(self.file(key)):
                view[prefix] = RESIDENT
            elif key in writing:
                view[prefix] = PENDING
        return view

    def damage(self, how: str) -> int:
        """Cut (`truncate`) or delete (`remove`) every block file; how many it touched."""
        found = self.files()
        for path in found:
            if how == "remove":
                os.remove(path)
            else:
                os.truncate(path, TRUNCATED_BYTES)
        return len(found)

    def close(self, keep_files: bool = False) -> None:
        """Shut the manager down (its /dev/shm region goes) and remove the root, unless
        `keep_files` (a restart: the next engine opens the same directory)."""
        try:
            self.manager.shutdown()
        finally:
            if not keep_files:
                shutil.rmtree(self.root, ignore_errors=True)


def open_tiering(
    l2_pages: int, page_size: int, policy: str = "lru", root: str | None = None
) -> FileTier:
    """A fresh engine (module docstring): `l2_pages` CPU chunks, a file tier in `root`
    (None: a new empty temporary directory; else one an earlier engine wrote, whose files the
    new one finds). EngineUnavailable when vLLM cannot be imported."""
    try:
        with engine_import_path():  # the repository's kernels/ shadows a package (engine_path)
            cfg = importlib.import_module("vllm.v1.kv_offload.config")
            spec = importlib.import_module("vllm.v1.kv_offload.tiering.spec")
    except ImportError as e:
        raise EngineUnavailable(
            f"vLLM's tiering manager cannot be imported ({e}); install vLLM as "
            "hicache/testing/adapters/vllm.py's docstring says"
        ) from e
    root = root or tempfile.mkdtemp(prefix="hicache-vllm-fs-")
    parallel = cfg.OffloadingParallelConfig(
        rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
        data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
        is_parallelism_agnostic=True,
    )  # fmt: skip
    config = cfg.OffloadingConfig(
        groups=(cfg.OffloadingGroupConfig(page_size, ("layer0",), 0),),
        worker_kv_bytes_per_block=CHUNK_BYTES,
        enable_kv_cache_events=True,  # vllm_check compares the CPU tier's events with its state
        extra_config={
            "cpu_bytes_to_use": CHUNK_BYTES * l2_pages,
            "eviction_policy": policy,
            "secondary_tiers": [
                {"type": "fs", "root_dir": root, "n_read_threads": 0, "n_write_threads": 0}
            ],
        },
        engine_id=f"hicache-{os.getpid()}-{next(_opened)}",
        model=cfg.OffloadingModelConfig(name="hicache/oracle", dtype="float16"),
        cache=cfg.OffloadingCacheConfig(tokens_per_hash=page_size, blocks_per_chunk=1),
        parallel=parallel,
    )
    manager = spec.TieringOffloadingSpec(config).get_manager()
    fs = manager.secondary_tiers[0]
    # Verify the tier took no threads: nothing but the players may run its jobs.
    assert not fs._pool._threads, "the file tier started I/O threads"
    fs._pool = FileJobPlayer()
    return FileTier(manager, fs, fs._pool, LookupPlayer(fs._lookup_manager), root)
