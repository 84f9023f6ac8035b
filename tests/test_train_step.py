"""training.step.train_step: the real optimizer step of train.py, decided on the device.

Accumulated micro-batches give one backward's gradients over the whole batch, clipping
scales them to grad_clip only above it, non-finite steps leave no trace, fp16 unscales
before measuring and clipping, overflows are the loss scale's business, the host reads
nothing during a step.
"""

import collections
import functools
import math

import pytest
import torch

from conf import OptimConfig
from conftest import tiny_config
from model import GPT
from run.distributed import Ranks
from run.runtime import resolve_precision
from training.optim import build_optimizer
from training.step import (
    NonFiniteLoss,
    Prefetcher,
    StepResult,
    Trainer,
    TrainWindow,
    WindowSummary,
    check_finite,
    train_step,
)

CPU = torch.device("cpu")
HOST_READS = ("item", "tolist", "__bool__", "__float__", "__int__")


class Batches:
    """A Prefetcher stand-in: a fixed batch per (step, micro_step)."""

    def __init__(self, device=CPU):
        self.device = device

    def get(self, step, micro):
        generator = torch.Generator().manual_seed(1000 * step + micro)
        x = torch.randint(97, (2, 16), generator=generator)
        return x.to(self.device), torch.roll(x, -1, dims=1).to(self.device)

    def fetch_after(self, step, micro):
        pass


def make_step(precision="fp32", accum=1, grad_clip=1.0, seed=0, scaler=None, device=CPU, dropout=0.0, optim="adamw"):
    torch.manual_seed(seed)
    model = GPT(tiny_config(dropout=dropout)).to(device)
    prec = resolve_precision(precision, device)
    optimizer = build_optimizer(model, OptimConfig(name=optim, weight_decay=0.1, learning_rate=1e-2), device.type)
    return (
        model,
        optimizer,
        stepper(
            Trainer(
                model,
                optimizer,
                scaler or prec.grad_scaler(),
                prec.autocast(),
                accum_steps=accum,
                grad_clip=grad_clip,
                ranks=Ranks(),
            )
        ),
    )


def stepper(trainer):
    """train_step bound to one Trainer, the scaler in sight."""
    step = functools.partial(train_step, trainer)
    step.scaler = trainer.scaler
    return step


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def poison_gradient_once(model):
    """An inf in one gradient element during the next backward, the loss staying finite."""

    def hook(grad):
        handle.remove()
        grad = grad.clone()
        grad.view(-1)[3] = float("inf")
        return grad

    handle = model.transformer.wpe.weight.register_hook(hook)


@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_an_inf_gradient_with_a_finite_loss_applies_no_update_and_leaves_no_trace(optim):
    model, optimizer, step = make_step(optim=optim)
    before = weights(model)
    poison_gradient_once(model)
    skipped = step(Batches(), 0)
    assert torch.isfinite(skipped.loss) and not torch.isfinite(skipped.grad_norm)
    assert bool(skipped.skipped) and bool(skipped.nonfinite)
    assert_same(weights(model), before)  # neither the update nor weight decay touched a weight
    parts = optimizer.parts.values() if optim == "muon" else [optimizer]
    # Adam's bias correction unmoved, Muon's momentum not started
    assert all(
        state.get("step", 0) == 0 and "momentum_buffer" not in state for part in parts for state in part.state.values()
    )

    applied = step(Batches(), 1)
    twin, _, twin_step = make_step(optim=optim)  # the same initial weights, never saw the bad step
    twin_step(Batches(), 1)
    assert not bool(applied.skipped)
    assert_same(weights(model), weights(twin))  # no stale gradient carried into step 1


def test_a_nonfinite_loss_applies_no_update(monkeypatch):
    model, _, step = make_step(accum=2)
    before = weights(model)
    original = GPT.forward
    calls = {"n": 0}

    def forward(self, idx, targets=None, **kwargs):
        logits, loss = original(self, idx, targets, **kwargs)
        calls["n"] += 1
        return logits, loss * float("nan") if calls["n"] == 2 else loss  # the second micro-batch only

    monkeypatch.setattr(GPT, "forward", forward)
    result = step(Batches(), 0)
    assert torch.isnan(result.loss) and bool(result.skipped) and bool(result.nonfinite)
    assert_same(weights(model), before)


def test_fp16_measures_and_clips_the_unscaled_gradients():
    """Through the real step with GradScaler: the gradient norm is fp32's, not 65536
    times it, and the update is applied."""
    fp16_model, _, fp16 = make_step("fp16", grad_clip=0.5)
    fp32_model, _, fp32 = make_step("fp32", grad_clip=0.5)
    before = weights(fp16_model)
    assert fp16.scaler.is_enabled() and fp16.scaler.get_scale() == 65536.0
    a, b = fp16(Batches(), 0), fp32(Batches(), 0)
    assert float(a.grad_norm) == pytest.approx(float(b.grad_norm), rel=2e-2)
    assert float(b.grad_norm) > 0.5  # clipping was active
    assert not bool(a.skipped)
    moved = [name for name, value in weights(fp16_model).items() if not torch.equal(value, before[name])]
    assert len(moved) == len(before)


def test_fp16_overflow_skips_the_step_and_lowers_the_scale_without_counting_as_nonfinite():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120)  # any fp16 gradient overflows
    model, _, step = make_step("fp16", scaler=scaler)
    before = weights(model)
    result = step(Batches(), 0)
    assert torch.isfinite(result.loss) and bool(result.skipped) and not bool(result.nonfinite)
    assert_same(weights(model), before)
    assert scaler.get_scale() == 2.0**119


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_step_reads_nothing_to_the_host(monkeypatch, precision):
    """Loss, norm and the skip decision stay tensors: no .item(), bool() or float() in a step."""
    _, _, step = make_step(precision, accum=2)
    step(Batches(), 0)  # first step: the optimizer allocates its state
    reads = collections.Counter()
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            reads[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    for i in range(1, 4):
        step(Batches(), i)
    monkeypatch.undo()
    assert not reads, dict(reads)


def test_the_prefetcher_serves_exactly_the_loaders_batches():
    class Loader:
        accum_steps = 2

        def __init__(self):
            self.calls = []

        def get_batch(self, step, micro):
            self.calls.append((step, micro))
            return torch.tensor([step, micro]), torch.tensor([micro, step])

    loader = Loader()
    batches = Prefetcher(loader)
    for step in range(2):
        for micro in range(2):
            x, _ = batches.get(step, micro)
            assert x.tolist() == [step, micro]
            batches.fetch_after(step, micro)
    assert loader.calls == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]  # each fetched once, one ahead
    assert batches.get(5, 1)[0].tolist() == [5, 1]  # an unexpected request still gets its own batch


def result(loss, skipped=False, nonfinite=False, stop=False, grad_norm=1.0):
    t = torch.tensor
    return StepResult(loss=t(loss), grad_norm=t(grad_norm), skipped=t(skipped), nonfinite=t(nonfinite), stop=t(stop))


def test_the_window_averages_the_applied_steps_and_remembers_the_first_bad_one():
    window = TrainWindow(CPU)
    window.add(11, result(2.0))
    window.add(12, result(float("nan"), skipped=True, nonfinite=True, grad_norm=float("nan")))
    window.add(13, result(4.0, grad_norm=3.0))
    window.add(14, result(float("inf"), skipped=True, nonfinite=True, stop=True))
    summary = window.read()
    assert (summary.steps, summary.loss, summary.skipped, summary.nonfinite) == (4, 3.0, 2, 2)
    assert summary.first_nonfinite_step == 12 and summary.stop
    fresh = window.read()  # reading starts a new window
    assert (fresh.steps, fresh.loss, fresh.nonfinite, fresh.first_nonfinite_step, fresh.stop) == (
        0,
        None,
        0,
        None,
        False,
    )


def reference_gradients(batches, parts, seed=0):
    """Plain autograd, the independent reference: one forward and one backward over the
    whole batch, the k micro-batches side by side. Returns (loss, gradients, their norm)."""
    torch.manual_seed(seed)
    model = GPT(tiny_config())
    x, y = (torch.cat(t) for t in zip(*(batches.get(0, micro) for micro in range(parts))))
    _, loss = model(x, y)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, global_norm(grads)


def global_norm(grads):
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))


def gradients_the_optimizer_receives(model, optimizer):
    """The parameters' gradients at each optimizer.step(), by name (after unscaling and clipping)."""
    names = {p: name for name, p in model.named_parameters()}
    seen = []
    optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: seen.append({names[p]: p.grad.clone() for g in opt.param_groups for p in g["params"]})
    )
    return seen


@pytest.mark.parametrize("accum", [1, 4])
def test_accumulated_micro_batches_give_the_loss_and_gradients_of_one_backward_over_the_whole_batch(accum):
    """Each micro-batch's loss is divided by accum_steps before its backward: the summed
    gradients are the whole batch's mean gradient, not accum_steps times it."""
    loss, grads, norm = reference_gradients(Batches(), accum)
    model, optimizer, step = make_step(accum=accum, grad_clip=0.0)  # no clipping: the optimizer sees the raw gradients
    received = gradients_the_optimizer_receives(model, optimizer)
    result = step(Batches(), 0)
    torch.testing.assert_close(result.loss, loss, rtol=1e-6, atol=0)
    torch.testing.assert_close(result.grad_norm, norm, rtol=1e-5, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(received[0][name], grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("clip_over_norm", [0.25, 4.0])
def test_the_optimizer_receives_the_gradients_scaled_down_to_grad_clip_only_when_their_norm_exceeds_it(clip_over_norm):
    _, grads, norm = reference_gradients(Batches(), 2)
    grad_clip = float(norm) * clip_over_norm
    model, optimizer, step = make_step(accum=2, grad_clip=grad_clip)
    received = gradients_the_optimizer_receives(model, optimizer)
    result = step(Batches(), 0)
    torch.testing.assert_close(result.grad_norm, norm, rtol=1e-5, atol=0)  # the norm before clipping is logged
    scale = min(1.0, clip_over_norm)
    for name, grad in grads.items():
        torch.testing.assert_close(received[0][name], grad * scale, rtol=1e-4, atol=1e-7, msg=name)
    clipped_norm = global_norm(received[0])
    assert clipped_norm <= grad_clip * (1 + 1e-5)
    assert clipped_norm == pytest.approx(min(grad_clip, float(norm)), rel=1e-5)


def test_an_unfused_optimizer_skips_too():
    """The benchmark's reference uses torch's default AdamW on a CPU: the host decides."""
    torch.manual_seed(0)
    model = GPT(tiny_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    step = stepper(
        Trainer(
            model,
            optimizer,
            torch.amp.GradScaler("cpu", enabled=False),
            resolve_precision("fp32", CPU).autocast(),
            accum_steps=1,
            grad_clip=1.0,
            ranks=Ranks(),
        )
    )
    before = weights(model)
    poison_gradient_once(model)
    assert bool(step(Batches(), 0).skipped)
    assert_same(weights(model), before)
    assert not bool(step(Batches(), 1).skipped)
    assert not torch.equal(weights(model)["transformer.wpe.weight"], before["transformer.wpe.weight"])


# --- CUDA: the same step on a GPU (skipped on a CPU machine) --------------------------------------------

CUDA = torch.device("cuda")


@pytest.mark.cuda
def test_cuda_steps_never_synchronise_with_the_host():
    _, _, step = make_step("bf16", accum=2, device=CUDA)
    batches = Prefetcher(_CudaLoader())
    step(batches, 0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any blocking host read raises
    try:
        for i in range(1, 4):
            step(batches, i)
    finally:
        torch.cuda.set_sync_debug_mode("default")


class _CudaLoader:
    """Pinned, non-blocking copies, as BatchLoader makes them on CUDA."""

    accum_steps = 2

    def get_batch(self, step, micro):
        x, y = Batches().get(step, micro)
        return x.pin_memory().to(CUDA, non_blocking=True), y.pin_memory().to(CUDA, non_blocking=True)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cuda_mixed_precision_steps_track_fp32(precision):
    """Losses and gradient norms within 2% and 5% of fp32's over three steps. (Weights are
    not compared element by element: AdamW's first steps move each weight by about
    lr * sign(gradient), so a near-zero gradient whose sign differs in bf16 lands 2 lr away.)"""
    _, _, mixed = make_step(precision, device=CUDA)
    _, _, fp32 = make_step("fp32", device=CUDA)
    for i in range(3):
        a, b = mixed(Batches(CUDA), i), fp32(Batches(CUDA), i)
        assert not bool(a.skipped)
        assert float(a.loss) == pytest.approx(float(b.loss), rel=2e-2)
        assert float(a.grad_norm) == pytest.approx(float(b.grad_norm), rel=5e-2)


@pytest.mark.cuda
def test_cuda_inf_gradient_is_skipped_on_the_device():
    model, _, step = make_step("bf16", device=CUDA)
    before = weights(model)
    poison_gradient_once(model)
    assert bool(step(Batches(CUDA), 0).skipped)
    assert_same(weights(model), before)


@pytest.mark.parametrize(
    "optimizer, named",
    [("adamw", r"Lower optim\.learning_rate,"), ("muon", r"Lower optim\.muon_lr \(Muon's.*or optim\.learning_rate")],
)
def test_the_nonfinite_advice_names_the_learning_rate_that_applies(optimizer, named):
    summary = WindowSummary(
        steps=1, loss=None, grad_norm=math.inf, skipped=1, nonfinite=1, first_nonfinite_step=7, stop=False
    )
    with pytest.raises(NonFiniteLoss, match=named):
        check_finite(summary, "stop", None, logger=None, optimizer=optimizer)
