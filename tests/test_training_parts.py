"""Schedule, precision, RNG state and the metrics log: the parts train.py is built from."""

import io
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from run.metrics import read_metrics
from run.runtime import configure_cuda, resolve_device, resolve_precision, rng_state, set_rng_state
from training.logger import RunLogger
from training.mfu import estimate_mfu, gpu_datasheet_peak, measure_matmul_flops
from training.step import learning_rate

SCHEDULE = dict(max_lr=1e-3, min_lr=1e-4, warmup_iters=100, decay_iters=2000)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    lrs = [learning_rate(s, **SCHEDULE) for s in range(2200)]
    assert lrs[0] == pytest.approx(1e-5)
    assert lrs[49] == pytest.approx(5e-4)
    assert lrs[99] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(lrs[100:2000], lrs[101:2000]))  # strictly decreasing
    assert lrs[1050] == pytest.approx((1e-3 + 1e-4) / 2)  # halfway down the cosine
    assert lrs[2000] == lrs[2199] == 1e-4


def test_wsd_holds_the_peak_then_falls_in_a_straight_line_over_the_cooldown():
    lrs = [learning_rate(s, **SCHEDULE, cooldown_frac=0.25) for s in range(2200)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[99] == pytest.approx(1e-3)  # the same warmup
    assert lrs[100] == lrs[1500] == 1e-3  # held until the last quarter of decay_iters (step 1500)
    for step in (1501, 1750, 1999):  # then the line from (1500, 1e-3) to (2000, 1e-4)
        assert lrs[step] == pytest.approx(1e-3 - (step - 1500) / 500 * (1e-3 - 1e-4))
    assert lrs[2000] == lrs[2199] == 1e-4
    whole = [learning_rate(s, **SCHEDULE, cooldown_frac=1.0) for s in range(2000)]
    assert whole[1050] == pytest.approx((1e-3 + 1e-4) / 2)  # a cooldown longer than the rest starts after warmup


CPUINFO_AVX512 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 avx512f {}\n\nprocessor\t: 1\n"


@pytest.mark.parametrize(
    "cpuinfo, chosen",
    [
        (CPUINFO_AVX512.format("avx512_bf16 avx512vl"), "bf16"),
        (CPUINFO_AVX512.format("amx_tile amx_bf16"), "bf16"),
        (CPUINFO_AVX512.format("avx512vl avx512_vnni"), "fp32"),  # AVX-512 alone emulates bf16
        (CPUINFO_AVX512.format("avx512_bf16_x"), "fp32"),  # a flag is a whole word
        (None, "fp32"),  # no /proc/cpuinfo (not Linux): fp32
    ],
)
def test_precision_auto_on_a_cpu_is_bf16_where_its_flags_say_it_computes_bf16(tmp_path, monkeypatch, cpuinfo, chosen):
    from run import runtime

    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(cpuinfo)
    monkeypatch.setattr(runtime, "CPUINFO", path)
    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu, cpu_bf16=True).name == chosen  # training's autocast
    assert resolve_precision("auto", cpu).name == "fp32"  # sampling's weights stay fp32
    assert resolve_precision("bf16", cpu).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp8", cpu)


@pytest.mark.parametrize("bf16, chosen", [(True, "bf16"), (False, "fp16")])
def test_precision_auto_on_cuda_is_bf16_where_supported_else_fp16(monkeypatch, bf16, chosen):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: bf16)
    precision = resolve_precision("auto", torch.device("cuda"), cpu_bf16=True)
    assert (precision.name, precision.device_type, precision.uses_grad_scaler) == (chosen, "cuda", chosen == "fp16")


def test_device_choices_are_validated():
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(ValueError, match="device must be auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


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


@pytest.mark.parametrize(
    "name, precision, label, flops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989e12),
        ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", "bf16", "H100 NVL", 835e12),
        ("NVIDIA H200", "tf32", "H200 SXM", 494e12),
        ("NVIDIA H200 NVL", "bf16", "H200 NVL", 835e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", "A100", 312e12),
        ("NVIDIA A100 80GB PCIe", "fp32", "A100", 19.5e12),
        ("NVIDIA L4", "bf16", "L4", 121e12),
        ("NVIDIA L40", "bf16", "L40", 181e12),
        ("NVIDIA L40S", "bf16", "L40S", 362e12),
        ("NVIDIA GeForce RTX 4090", "bf16", "RTX 4090", 165e12),
        ("Tesla V100-SXM2-16GB", "fp16", "V100 SXM2", 125e12),
        ("Tesla T4", "fp16", "T4", 65e12),
    ],
)
def test_gpu_peaks_match_the_whole_device_name(name, precision, label, flops):
    peak = gpu_datasheet_peak(name, precision)
    assert peak.flops == flops and peak.source == f"{label} datasheet, {precision}"


@pytest.mark.parametrize(
    "name, precision",
    [("NVIDIA A10G", "bf16"), ("NVIDIA L40G", "bf16"), ("Tesla T4", "bf16"), ("NVIDIA H100X", "bf16")],
)
def test_unknown_gpus_and_precisions_have_no_peak(name, precision):
    assert gpu_datasheet_peak(name, precision) is None  # MFU is then not reported, rather than wrong


def test_measuring_the_cpu_peak_draws_nothing_from_the_global_random_streams():
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    measure_matmul_flops(size=64, trials=1)
    torch.testing.assert_close(torch.rand(4), expected)


@pytest.mark.parametrize("tf32", [True, False])
def test_tf32_switch_sets_cuda_matmul_precision(tf32):
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        configure_cuda(tf32)
        assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.cuda
def test_cuda_rng_state_is_the_devices_own_and_restores_exactly():
    device = torch.device("cuda", torch.cuda.current_device())
    state = rng_state(device)
    assert isinstance(state["cuda"], torch.Tensor)  # one device's state, not a list of all of them
    expected = torch.rand(4, device=device)
    set_rng_state(state, device)
    torch.testing.assert_close(torch.rand(4, device=device), expected)


@pytest.mark.cuda
def test_tf32_false_means_true_fp32_matmuls():
    a, b = torch.randn(512, 512, dtype=torch.float64), torch.randn(512, 512, dtype=torch.float64)
    exact = a @ b
    errors = {}
    try:
        for tf32 in (True, False):
            configure_cuda(tf32)
            product = (a.float().cuda() @ b.float().cuda()).double().cpu()
            errors[tf32] = (product - exact).abs().max().item()
    finally:
        configure_cuda(True)
    assert errors[False] < 1e-3 < errors[True]  # fp32 keeps ~7 digits, TF32 ~3


def make_logger(run_dir, start_step):
    return RunLogger(
        run_dir, start_step=start_step, max_iters=10, progress=False, wandb_settings={"mode": "disabled"}, config={}
    )


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
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("eval", 4),
        ("train", 5),
    ]


def test_a_precision_slower_than_fp32_on_this_cpu_is_named_with_both_rates(monkeypatch):
    from training import mfu

    rates = {torch.float32: 150e9, torch.bfloat16: 5e9, torch.float16: 300e9}
    monkeypatch.setattr(mfu, "measure_matmul_flops", lambda size=2048, trials=3, dtype=torch.float32: rates[dtype])
    assert mfu.slow_cpu_precision("bf16") == (
        "precision=bf16 on this CPU: matmuls run 30x slower than in fp32 (measured just now: 5 against 150 "
        "GFLOP/s); precision=fp32 is faster here"
    )
    assert mfu.slow_cpu_precision("fp16") is None  # faster than fp32 here: nothing to say
    assert mfu.slow_cpu_precision("fp32") is None


def test_schedules_that_end_early_are_pointed_out():
    from training.step import schedule_warnings

    [inside] = schedule_warnings(max_iters=50, warmup_iters=100, decay_iters=50)
    assert "never reaches its peak and never decays" in inside
    [early] = schedule_warnings(max_iters=500, warmup_iters=100, decay_iters=1000)
    assert "stops above optim.min_lr" in early
    assert schedule_warnings(max_iters=1000, warmup_iters=100, decay_iters=1000) == []


def test_a_torn_last_line_is_dropped_and_said_so_and_appending_goes_on(tmp_path, capsys):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"kind": "train", "step": 1, "loss": 2.0}\n{"kind": "train", "step": 2, "lo')  # disk full
    assert read_metrics(tmp_path) == [{"kind": "train", "step": 1, "loss": 2.0}]
    assert (
        "metrics.jsonl: its last line was cut short by an interrupted write and is left out" in capsys.readouterr().err
    )  # what a reader such as report.py says
    logger = make_logger(tmp_path, 1)
    logger.log({"kind": "train", "step": 2, "loss": 1.5})
    logger.close()
    assert "dropped its last line, cut short by an interrupted write" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_last_record_without_its_newline_is_kept_and_the_next_starts_a_new_line(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 2.0}')
    logger = make_logger(tmp_path, 1)
    logger.log({"kind": "train", "step": 2, "loss": 1.5})
    logger.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_malformed_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path):
    from run.metrics import MetricsError

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(MetricsError, match=r"metrics.jsonl line 2 is not a JSON record"):
        read_metrics(tmp_path)


def test_a_resume_that_trains_nothing_keeps_the_whole_log(tmp_path):
    logger = make_logger(tmp_path, 0)
    for step in range(1, 5):
        logger.log({"kind": "train", "step": step, "loss": 1.0})
    logger.close()
    RunLogger(
        tmp_path, start_step=2, max_iters=2, progress=False, wandb_settings={"mode": "disabled"}, config={}
    ).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]


def test_the_run_lock_names_its_holder_and_is_free_again_after(tmp_path):
    import os

    from run.run_dir import run_lock

    with run_lock(tmp_path, new_run=False):
        with pytest.raises(ValueError, match=f"is in use: process {os.getpid()} is writing it"):
            with run_lock(tmp_path, new_run=False):
                pass
    with run_lock(tmp_path, new_run=False):
        pass  # released on exit
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    (tmp_path / "groups.yaml").write_text("model: nano\n")
    with run_lock(tmp_path, new_run=True) as takeover:  # a run that stopped before its first save
        assert takeover == f"{tmp_path} held a run that stopped before its first checkpoint: starting it afresh"
    assert not tmp_path.exists()  # and this one failed before it began: nothing of either is left
    tmp_path.mkdir()
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    checkpoint = tmp_path / "checkpoints" / "step_000001"
    checkpoint.mkdir(parents=True)
    for name in ("model.safetensors", "config.yaml"):
        (checkpoint / name).write_text("")
    with pytest.raises(ValueError, match="already holds a run"):  # taken, and saved, while we waited for the lock
        with run_lock(tmp_path, new_run=True):
            pass


def test_an_allocation_that_failed_is_one_line_and_other_errors_are_not_hidden():
    from system import describe_out_of_memory as out_of_memory

    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:118] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 40243200000 bytes. Error code 12 (Cannot allocate memory)"
    )
    assert out_of_memory(cpu, "lower batch_size").startswith("out of memory ([enforce fail")
    assert out_of_memory(cpu, "lower batch_size").endswith("Cannot allocate memory)): lower batch_size")
    cuda = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    assert out_of_memory(cuda, "lower it") == "out of memory (CUDA out of memory. Tried to allocate 2.00 GiB): lower it"
    assert out_of_memory(RuntimeError("shape mismatch"), "lower it") is None


OUT_OF_MEMORY = """
import runpy, sys
import {module}
def allocate(*args, **kwargs):
    raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 80000000000 bytes")
{module}.{function} = allocate  # the script imports it by name, so it runs this one
sys.argv = [{script!r}] + sys.argv[1:]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize(
    "script, module, function, advice",
    [
        ("train.py", "conf", "load_config", "lower batch_size, model.block_size or the model's size"),
        (
            "sample.py",
            "conf.sample_config",
            "load_sample_config",
            "lower num_samples, or the model's memory with weights=bf16",
        ),
    ],
)
def test_out_of_memory_ends_a_script_with_one_line_of_advice(tmp_path, script, module, function, advice):
    repo = Path(__file__).resolve().parents[1]
    wrapper = tmp_path / "allocate.py"
    wrapper.write_text(OUT_OF_MEMORY.format(module=module, function=function, script=str(repo / script)))
    result = subprocess.run(
        [sys.executable, str(wrapper)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert (
        result.stderr.startswith("error: out of memory (DefaultCPUAllocator: can't allocate memory")
        and advice in result.stderr
    )


def test_a_run_writes_its_groups_before_its_config(tmp_path, monkeypatch):
    """A kill between the two leaves no config.yaml without groups.yaml, which would look foreign."""
    from omegaconf import OmegaConf

    from run import run_dir

    written, save, write_atomic = [], OmegaConf.save, run_dir.write_atomic
    monkeypatch.setattr(
        OmegaConf,
        "save",
        lambda config, path, **kwargs: (written.append(Path(path).name), save(config, path, **kwargs)),
    )
    monkeypatch.setattr(
        run_dir, "write_atomic", lambda path, text: (written.append(path.name), write_atomic(path, text))
    )
    run_dir.save_run_config(tmp_path, {"seed": 1, "resume": "somewhere"})
    assert written == ["groups.yaml", "config.yaml"]
    assert OmegaConf.load(tmp_path / "config.yaml") == {"seed": 1, "resume": None}  # replaced whole, resume cleared
