"""A state dict checked against the model it is for: every tensor present at its shape, every
value finite. run/ (checkpoints) and hf/ (transformers files) check what they load with these."""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from .config import GPTConfig

# A tied head shares its matrix with the token embedding (transformer.wte.weight); only one copy is stored.
TIED_HEAD = "lm_head.weight"
# Key prefixes added by torch.compile (_orig_mod.) and DistributedDataParallel (module.).
WRAPPER_PREFIXES = re.compile(r"^(?:(?:_orig_mod|module)\.)+")


def fit_problems(state: dict[str, Tensor], expected: dict, what: str, against: str, optional=frozenset()) -> str:
    """What keeps `state` (`what` holds it) from fitting `expected` (name -> shape, by `against`): the names missing
    (those in `optional` may be), unexpected or differently shaped, a few of each; '' when it fits."""
    missing = sorted(set(expected) - set(state) - optional)
    unexpected = sorted(set(state) - set(expected))
    wrong_shape = [
        f"{name} is {tuple(tensor.shape)} in {what}, {tuple(expected[name])} by {against}"
        for name, tensor in state.items()
        if name in expected and tensor.shape != expected[name]
    ]
    labelled = (("missing", missing), ("unexpected", unexpected), ("different shapes", wrong_shape))
    return "; ".join(f"{label} {first_few(names)}" for label, names in labelled if names)


def non_finite(state: dict[str, Tensor]) -> str:
    """The names of the floating-point tensors holding inf or NaN (a few, for a message), or ''."""
    floats = {name: tensor for name, tensor in state.items() if tensor.is_floating_point()}
    if not floats:
        return ""
    finite = torch.stack([tensor.isfinite().all() for tensor in floats.values()])  # one host read for all
    return "" if bool(finite.all()) else first_few([name for name, ok in zip(floats, finite.tolist()) if not ok])


def first_few(names: list[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain GPT inside torch.compile and DistributedDataParallel wrappers."""
    while (inner := getattr(model, "_orig_mod", None) or getattr(model, "module", None)) is not None:
        model = inner
    return model


def shared_names(config: GPTConfig) -> set[str]:
    """The state-dict names that are another's matrix: the head, when tied to the token table."""
    return {TIED_HEAD} if config.tie_embeddings else set()
