"""Huge-page memory for decoding: what it holds, and that the OS really backs it with
huge pages where it offers them."""

import mmap
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from conftest import tiny_config
from model import KVCache, Sampling, generate, huge_page_zeros, to_decode_layout

HUGE_PAGE = 2 * 2**20
linux_huge_page_advice = pytest.mark.skipif(
    sys.platform != "linux" or not hasattr(mmap, "MADV_HUGEPAGE"), reason="no huge-page advice on this OS"
)


def advised_huge_pages(tensor: torch.Tensor) -> bool:
    """Whether the memory mapping holding tensor's data is advised to use huge pages
    (its VmFlags carry `hg`). Whether the kernel grants them depends on its settings
    and on free memory, so tests check the advice and the alignment, which are ours."""
    address = tensor.data_ptr()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        first = line.split()[0]
        if "-" in first and ":" not in first:  # a mapping's header: start-end perms ...
            start, end = (int(part, 16) for part in first.split("-"))
            inside = start <= address < end
        elif inside and first == "VmFlags:":
            return "hg" in line.split()[1:]
    raise AssertionError(f"no mapping holds address {address:#x}")


@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 2**20 + 3)])  # below and above one huge page
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8])
def test_huge_page_zeros_is_a_zeroed_writable_contiguous_tensor(shape, dtype):
    tensor = huge_page_zeros(shape, dtype)
    assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
    assert tensor.device.type == "cpu" and not tensor.any()
    tensor.view(-1)[-5:-2] = 3
    assert int(tensor.sum()) == 9
    assert huge_page_zeros((0, 4), dtype).shape == (0, 4)


class RefusingMmap(mmap.mmap):
    """A mapping on a kernel built without transparent huge pages."""

    def madvise(self, *args):
        raise OSError(22, "Invalid argument")


@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no huge-page advice on this OS")
def test_a_kernel_that_refuses_huge_pages_still_gets_working_memory(monkeypatch, make_model):
    monkeypatch.setattr(mmap, "mmap", RefusingMmap)
    tensor = huge_page_zeros((4, 2**20))
    assert not tensor.any() and tensor.is_contiguous()
    model = make_model(n_embd=256, n_head=4, vocab_size=4096)
    logits, _ = model(torch.arange(12)[None])
    to_decode_layout(model)
    torch.testing.assert_close(model(torch.arange(12)[None])[0], logits)


@linux_huge_page_advice
def test_huge_page_zeros_asks_for_huge_pages_from_a_huge_page_boundary():
    tensor = huge_page_zeros((4, 2**20 + 1024))  # 16 MiB and a bit: mmap need not align it
    assert advised_huge_pages(tensor) and tensor.data_ptr() % HUGE_PAGE == 0


def gpt2_like_shapes_model(make_model):
    """Two layers wide enough that the packed weights span several huge pages."""
    return make_model(n_embd=256, n_head=4, block_size=64, vocab_size=4096)


@linux_huge_page_advice
def test_decode_layout_packs_every_linear_weight_into_one_huge_page_buffer(make_model):
    model = to_decode_layout(gpt2_like_shapes_model(make_model))
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    assert len({w.untyped_storage().data_ptr() for w in weights}) == 1
    assert advised_huge_pages(weights[0])


@linux_huge_page_advice
def test_cpu_kv_cache_lives_in_huge_pages():
    cache = KVCache(tiny_config(n_embd=64, block_size=1024), batch_size=64, max_len=1000)  # 15.6 MiB per tensor
    assert all(advised_huge_pages(t) and t.data_ptr() % HUGE_PAGE == 0 for t in cache.keys + cache.values)


def test_kv_cache_layers_are_separate_zeroed_tensors():
    cache = KVCache(tiny_config(), batch_size=2, max_len=8, dtype=torch.bfloat16)
    tensors = cache.keys + cache.values
    assert all(t.dtype == torch.bfloat16 and not t.any() for t in tensors)
    cache.keys[0].fill_(1.0)
    assert all(not t.any() for t in tensors[1:])


def test_decode_layout_keeps_a_bf16_model_and_its_generation(make_model):
    model = make_model(n_kv_head=2).to(torch.bfloat16)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    start = [5, 17, 3, 44]
    tokens = generate(model, [start], 12, Sampling(temperature=0))
    to_decode_layout(model)
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert generate(model, [start], 12, Sampling(temperature=0)) == tokens
