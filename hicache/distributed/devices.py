"""Which device each rank of a tensor-parallel cache runs on (device is RANK_LOCAL: C0 does
not compare it).

    rank_device(device, rank, size)   `cuda:rank` when `device` asks for CUDA (or is None, the
                                      default) and there is a GPU per rank; else `device`
                                      itself, every rank on it (one GPU shared, or the CPU)
    bind_device(device)               a rank process's current CUDA device set to its own

The demo's ranks (hicache/app/demo_tp.py) and the TP fuzz machine's simulated ranks
(hicache/testing/adapters/tp.py) both place themselves so: on two GPUs each rank has its own,
on one they share it. The demo's rank processes also bind their device; the fuzz's ranks,
threads of one process, do not, so a data plane that relies on the current device instead
of naming its own shows there.
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


def bind_device(device: str | None) -> None:
    """Make `device`, when it is `cuda:N`, this process's current CUDA device, as each rank
    process of a TP engine does first: what names no device (the CUDA context, an event, a
    stream looked up as current) then lands on the rank's own GPU, not on GPU 0. Nothing for
    the CPU, None, or a bare "cuda" (every rank on the current one)."""
    if device is None or not device.startswith("cuda:"):
        return
    import torch

    torch.cuda.set_device(torch.device(device))


__all__ = ["bind_device", "rank_device"]
