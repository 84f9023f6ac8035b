"""What only a CUDA GPU can show: sampling on the GPU against the CPU, CUDA-graph decode,
torch.compile's GPU code (Inductor's Triton kernels), checkpoints moving between GPU
and CPU, torchrun with NCCL through the real train.py, and the fp16 GradScaler on CUDA.
Every test here is marked `cuda` and skips on a machine without one (the GPU acceptance
run, bench/gpu_check.py, runs them with `python -m pytest -m cuda`).

Device-independent behaviour (the KV cache on a padded batch, ...) is not here: it is
written once over tests/devices.py's DEVICES, so the CPU runs it on every machine and
`-m cuda` selects its CUDA instance. The CPU's own torch.compile check is a compiled
train.py run in tests/test_train.py (a cold CPU compile costs ~90 s here); the fp16
overflow's CPU twin is in tests/test_train_step.py.

Tolerances: tests/devices.py (fp32 with TF32 off agrees to 1e-4 on CUDA).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import tiny_config, training_overrides
from devices import tolerance, true_fp32  # noqa: F401 (a fixture)
from model import GPT, Sampling, generate
from model.weight_formats import to_weight_format
from run.checkpoints import find_checkpoint, load_checkpoint
from run.metrics import read_metrics

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("true_fp32")]
REPO = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda")
TORCHRUN_TIMEOUT_S = 120  # a rendezvous that cannot connect fails in this time instead of torchrun's 300 s


def cuda_model(dtype=torch.float32, **overrides):
    torch.manual_seed(0)
    return GPT(tiny_config(**overrides)).to(CUDA, dtype).eval()


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_greedy_sampling_on_the_gpu_matches_the_cpu(n_kv_head):
    model = cuda_model(n_kv_head=n_kv_head)
    prompts = [[1, 2, 3], [5, 8, 13, 21, 34, 55]]
    greedy = Sampling(temperature=0)
    on_gpu = generate(model, prompts, 24, greedy)  # slides past block_size (16)
    seeded = Sampling(temperature=1.0, top_k=20, seed=1)
    assert generate(model, prompts, 8, seeded) == generate(model, prompts, 8, seeded)  # reproducible on the GPU
    assert on_gpu == generate(model.cpu(), prompts, 24, greedy)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_cuda_graph_decode_replays_exactly_the_static_steps(n_kv_head):
    """Padded rows, sampled, and past block_size so the window slides between replays."""
    model = cuda_model(n_kv_head=n_kv_head)
    prompts = [[5, 17, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9], [0, 44]]
    sampling = Sampling(temperature=1.0, top_k=30, seed=7)
    static = generate(model, prompts, 30, sampling, decode="static")
    assert generate(model, prompts, 30, sampling, decode="graph") == static
    greedy = Sampling(temperature=0)
    assert generate(model, prompts, 30, greedy, decode="graph") == generate(model, prompts, 30, greedy)


def test_bf16_weights_decode_on_the_gpu():
    model = to_weight_format(cuda_model(torch.bfloat16, n_kv_head=2), "bf16")
    tokens = generate(model, [[5, 17, 3]], 12, Sampling(temperature=0), decode="graph")
    assert len(tokens[0]) == 12 and all(0 <= t < 97 for t in tokens[0])


def test_compiled_model_equals_eager_on_the_gpu():
    model = cuda_model().train()
    idx = torch.randint(0, 97, (4, 16), device=CUDA)
    logits, loss = model(idx, idx)
    compiled_logits, compiled_loss = torch.compile(model)(idx, idx)
    torch.testing.assert_close(compiled_logits, logits, **tolerance(CUDA))
    torch.testing.assert_close(compiled_loss, loss, **tolerance(CUDA))


def train(*overrides, cwd, processes=0):
    # --local-addr: torchrun would publish socket.getfqdn() as the rendezvous address, which
    # a machine whose hostname does not resolve cannot reach (the run then waits out its timeout).
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "--local-addr=127.0.0.1",
    ]
    command = [*(launcher if processes else [sys.executable]), str(REPO / "train.py"), *overrides]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TORCHRUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_a_checkpoint_moves_from_the_gpu_to_the_cpu_and_back(tmp_path):
    overrides = training_overrides(tmp_path)
    run_dir = tmp_path / "run"
    gpu = [o for o in overrides if o != "device=cpu"] + ["device=cuda", "precision=bf16"]
    train(*gpu, "max_iters=4", "eval_interval=2", f"out_dir={run_dir}", cwd=tmp_path)
    train(f"resume={run_dir}", "device=cpu", "precision=fp32", "max_iters=6", cwd=tmp_path)
    train(f"resume={run_dir}", "device=cuda", "precision=bf16", "max_iters=8", cwd=tmp_path)
    checkpoint = load_checkpoint(find_checkpoint(run_dir, runs_root=tmp_path))
    assert checkpoint.training_state()["step"] == 8
    assert all(torch.isfinite(t).all() for t in checkpoint.model_state.values())
    assert [r["step"] for r in read_metrics(run_dir) if r["kind"] == "train"] == list(range(1, 9))


def test_torchrun_with_nccl_through_train_py(tmp_path):
    overrides = [o for o in training_overrides(tmp_path) if o != "device=cpu"] + ["device=cuda"]
    output = train(
        *overrides, "max_iters=4", "eval_interval=2", f"out_dir={tmp_path / 'run'}", cwd=tmp_path, processes=1
    )
    assert "cuda:0 bf16 x 1 process(es)" in output
    assert load_checkpoint(find_checkpoint(tmp_path / "run", runs_root=tmp_path)).training_state()["step"] == 4


def test_fp16_overflow_on_the_gpu_skips_and_backs_off():
    from conf import OptimConfig
    from run.distributed import Ranks
    from run.runtime import resolve_precision
    from training.optim import build_optimizer
    from training.step import Trainer, train_step

    model = cuda_model().train()
    precision = resolve_precision("fp16", CUDA)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**120)
    trainer = Trainer(
        model,
        build_optimizer(model, OptimConfig(), "cuda"),
        scaler,
        precision.autocast(),
        accum_steps=1,
        grad_clip=1.0,
        ranks=Ranks(),
    )

    class Batches:
        def get(self, step, micro):
            x = torch.randint(0, 97, (2, 16), device=CUDA)
            return x, x

        def fetch_after(self, step, micro):
            pass

    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_step(trainer, Batches(), 0)
    assert bool(result.skipped) and not bool(result.nonfinite)
    assert scaler.get_scale() == 2.0**119
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
