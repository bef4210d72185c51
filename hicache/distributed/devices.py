"""Which device each rank of a tensor-parallel cache runs on (device is RANK_LOCAL: C0 does
not compare it).

    rank_device(device, rank, size)   `cuda:rank` when `device` asks for CUDA (or is None, the
                                      default) and there is a GPU per rank; else `device`
                                      itself, every rank on it (one GPU shared, or the CPU)

The demo's ranks (hicache/demo_tp.py) and the TP fuzz machine's simulated ranks
(hicache/testing/adapters/tp.py) both place themselves so: on two GPUs each rank has its own,
on one they share it.
"""

from __future__ import annotations


def rank_device(device: str | None, rank: int, size: int, gpus: int | None = None) -> str | None:
    """Rank `rank` of `size`'s device (module docstring). `gpus`: the CUDA devices there are
    (None: ask torch; 0 without CUDA)."""
    assert 0 <= rank < size, f"rank {rank} of {size}"
    if device not in (None, "cuda"):
        return device
    if gpus is None:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"cuda:{rank}" if gpus >= size else device


__all__ = ["rank_device"]
