import os

import pytest
import torch
from hydra.core.hydra_config import HydraConfig

from model import GPT, GPTConfig

# Test models are tiny: a second intra-op thread only adds synchronisation, and on a
# busy machine OpenMP's barriers make a 2-thread step ~30x slower than a 1-thread one.
# Subprocesses (train.py runs) inherit the setting through the environment.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` need a CUDA GPU: they run on one and skip elsewhere."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def tiny_config(**overrides) -> GPTConfig:
    """A model small enough that every test runs in milliseconds."""
    base = dict(vocab_size=97, block_size=16, n_layer=2, n_head=4, n_embd=32, dropout=0.0, bias=True)
    base.update(overrides)
    return GPTConfig(**base)


@pytest.fixture(autouse=True)
def no_hydra_job_left_over():
    """A test that plays a sweep's job (HydraConfig set) must not leave it to the next test
    in the same worker: resume would read that job's command-line overrides as its own."""
    yield
    HydraConfig.instance().cfg = None


@pytest.fixture
def make_model():
    def make(seed: int = 0, **overrides) -> GPT:
        torch.manual_seed(seed)
        return GPT(tiny_config(**overrides)).eval()

    return make


CORPUS = (
    "First Citizen: Before we proceed any further, hear me speak.\n"
    "All: Speak, speak.\n"
    "First Citizen: You are all resolved rather to die than to famish?\n"
) * 40


def training_overrides(directory) -> list[str]:
    """Overrides for a seconds-long, offline training run inside `directory`."""
    corpus = directory / "corpus.txt"
    corpus.write_text(CORPUS)
    return [
        "model=nano",
        "model.block_size=32",
        "data=files",
        f"data.path={corpus}",
        "data.tokenizer=char",
        f"data.data_dir={directory / 'data'}",
        "data.num_proc=1",
        f"runs_root={directory / 'runs'}",
        "batch_size=4",
        "max_iters=30",
        "eval_interval=10",
        "eval_iters=2",
        "optim.warmup_iters=5",
        "optim.learning_rate=1e-2",
        "optim.min_lr=1e-3",
        "logging.log_interval=1",
        "logging.progress=false",
        "logging.peak_flops=1e12",
        "device=cpu",
        "precision=fp32",  # the same numbers on every CPU: precision=auto picks bf16 where the CPU computes it
        "recipe=gpt2",
    ]


@pytest.fixture
def train_overrides(tmp_path):
    return training_overrides(tmp_path)
