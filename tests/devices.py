"""Device-independent tests are written once and run on every device present.

DEVICES parametrises a test over the CPU, always (so CI runs it), and CUDA, marked
`cuda`: a machine without a GPU skips that instance, and `python -m pytest -m cuda`
(the GPU acceptance run's test stage) selects it.

Tolerances, for a model's logits (of order 1) computed two ways: on the CPU, fp32
results agree to a few ulps (1e-5); on CUDA, with TF32 off (the `true_fp32` fixture),
other kernels leave room for 1e-4; bf16 keeps ~3 significant digits (5e-2) anywhere.
"""

import pytest
import torch

DEVICES = [
    pytest.param(torch.device("cpu"), id="cpu"),
    pytest.param(torch.device("cuda"), id="cuda", marks=pytest.mark.cuda),
]


def tolerance(device: torch.device, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    if dtype == torch.bfloat16:
        return dict(rtol=5e-2, atol=5e-2)
    return dict(rtol=1e-5, atol=1e-5) if device.type == "cpu" else dict(rtol=1e-4, atol=1e-4)


@pytest.fixture
def true_fp32():
    """fp32 matmuls in true IEEE fp32 on CUDA (no TF32) for the test; restored after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
