"""What the CUDA tests that hold a caller's stream share: the hold, and a caller stream of each
test's own (a serving loop's is never the legacy default stream, which every other blocking
call would wait for). Imported after `pytest.importorskip("torch")`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

HOLD_CYCLES = 200_000_000  # `torch.cuda._sleep`: tens of milliseconds on any recent GPU


@pytest.fixture(autouse=True)
def caller_stream() -> Iterator[None]:
    """Each test runs on a caller stream of its own, as a serving loop's would be."""
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.synchronize()
