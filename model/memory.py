"""CPU memory backed by transparent huge pages, for tensors that are streamed whole (a batch-1 decode step reads
every weight and cached key and value once): with 2 MiB pages in place of 4 KiB ones, a stream needs 512 times fewer
TLB entries and reads measurably faster (bench/decode.py --small-pages compares the two)."""

from __future__ import annotations

import contextlib
import math
import mmap
from collections.abc import Sequence

import torch
from torch import Tensor

HUGE_PAGE = 2 * 2**20  # bytes: x86-64's and arm64's usual transparent huge page


def huge_page_zeros(shape: Sequence[int], dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """torch.zeros(shape, dtype=dtype, device=device) (default: the CPU); on the CPU, contiguous and backed by
    transparent huge pages where the OS offers them (Linux, with THP in `madvise` or `always` mode)."""
    nbytes = math.prod(shape) * dtype.itemsize
    advice = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux only
    if advice is None or nbytes < HUGE_PAGE or torch.device(device or "cpu").type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    try:
        # Private: shared memory takes huge pages only under a separate kernel setting (shmem_enabled), usually
        # off. One spare huge page lets the tensor start on a huge-page boundary.
        buffer = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:
        return torch.zeros(shape, dtype=dtype, device=device)
    with contextlib.suppress(OSError):  # a kernel built without THP refuses the advice; plain pages do
        buffer.madvise(advice)
    # Fresh anonymous pages read as zeros; the mapping lives as long as any view of it.
    whole = torch.frombuffer(buffer, dtype=torch.uint8)
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes].view(dtype).view(shape)
