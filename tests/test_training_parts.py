"""Schedule, precision, RNG state and the metrics log: the parts train.py is built from."""

import io
import random

import numpy as np
import pytest
import torch

from model import GPT
from training.logger import RunLogger, read_metrics
from training.mfu import estimate_mfu
from training.runtime import resolve_device, resolve_precision, rng_state, set_rng_state
from training.schedule import learning_rate

from conftest import tiny_config

SCHEDULE = dict(max_lr=1e-3, min_lr=1e-4, warmup_iters=100, decay_iters=2000)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    lrs = [learning_rate(s, **SCHEDULE) for s in range(2200)]
    assert lrs[0] == pytest.approx(1e-5)
    assert lrs[49] == pytest.approx(5e-4)
    assert lrs[99] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(lrs[100:2000], lrs[101:2000]))  # strictly decreasing
    assert lrs[1050] == pytest.approx((1e-3 + 1e-4) / 2)  # halfway down the cosine
    assert lrs[2000] == lrs[2199] == 1e-4


def test_precision_auto_is_fp32_on_cpu_and_choices_are_validated():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu).name == "fp32"
    assert resolve_precision("bf16", cpu).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", cpu)


def test_device_choices_are_validated():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_step_on_cpu_updates_weights(precision):
    """The CUDA code path (autocast + GradScaler for fp16) exercised on the CPU."""
    torch.manual_seed(0)
    model = GPT(tiny_config())
    prec = resolve_precision(precision, torch.device("cpu"))
    scaler = prec.grad_scaler()
    assert scaler.is_enabled() == (precision == "fp16")
    opt = model.configure_optimizer(0.0, 1e-2)
    before = model.transformer.wpe.weight.clone()
    idx = torch.randint(0, 97, (2, 16))
    with prec.autocast():
        _, loss = model(idx, idx)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    assert torch.isfinite(loss)
    assert not torch.equal(before, model.transformer.wpe.weight)


def test_rng_state_survives_weights_only_serialisation():
    state = rng_state(torch.device("cpu"))
    expected = (torch.rand(3), np.random.rand(3), random.random())
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    set_rng_state(torch.load(buffer, weights_only=True), torch.device("cpu"))
    actual = (torch.rand(3), np.random.rand(3), random.random())
    torch.testing.assert_close(actual[0], expected[0])
    np.testing.assert_array_equal(actual[1], expected[1])
    assert actual[2] == expected[2]


def test_mfu_is_achieved_over_peak():
    assert estimate_mfu(6e9, 1000.0, 12e12) == pytest.approx(0.5)


def make_logger(run_dir, start_step):
    return RunLogger(run_dir, start_step=start_step, max_iters=10, progress=False,
                     wandb_settings={"mode": "disabled"}, config={})


def test_resumed_metrics_log_drops_records_after_the_checkpoint(tmp_path, capsys):
    logger = make_logger(tmp_path, 0)
    for step in range(1, 7):
        logger.log({"kind": "train", "step": step, "loss": 1.0 / step})
    logger.log({"kind": "eval", "step": 4, "val_loss": 0.3})
    logger.close()
    assert "step      4 | eval  | val_loss 0.3000" in capsys.readouterr().out
    resumed = make_logger(tmp_path, 4)  # the checkpoint was at step 4; steps 5-6 were lost
    resumed.log({"kind": "train", "step": 5, "loss": 0.5})
    resumed.close()
    assert [(r["kind"], r["step"]) for r in read_metrics(tmp_path)] == [
        ("train", 1), ("train", 2), ("train", 3), ("train", 4), ("eval", 4), ("train", 5)
    ]
