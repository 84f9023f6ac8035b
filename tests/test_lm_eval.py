"""The lm-evaluation-harness model, offline: tiny tasks of our own (tests/lm_eval_tasks)
through the real lm_eval.simple_evaluate, against transformers models exported from the
same weights and scored by the harness's own `hf` model, against gptlab's full forward
pass, and against log-probabilities summed by hand."""

import json
from dataclasses import asdict
from functools import cache, partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from hydra.utils import instantiate
from omegaconf import OmegaConf

lm_eval = pytest.importorskip("lm_eval")  # the `eval` extra; .ci/run installs it
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.api.registry import get_model  # noqa: E402
from lm_eval.tasks import TaskManager  # noqa: E402

import export  # noqa: E402
from conf import CONF_DIR  # noqa: E402
from conf.downstream_config import DownstreamConfig  # noqa: E402
from data import load_tokenizer  # noqa: E402
from data.bpe import train_bpe  # noqa: E402
from evaluation import downstream  # noqa: E402
from evaluation import lm as lm_module  # noqa: E402
from evaluation.after_training import DownstreamAfterTraining  # noqa: E402
from evaluation.lm import GptlabLM  # noqa: E402
from hf.gpt2 import pool_kv_heads  # noqa: E402
from hf_reference import randomized  # noqa: E402
from model import GPT, GPTConfig, Sampling, generate  # noqa: E402
from run.checkpoints import Checkpoints, load_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "tests" / "lm_eval_tasks"
BLOCK = 64
SHAPE = dict(vocab_size=50304, block_size=BLOCK, n_layer=2, n_head=4, n_embd=64, dropout=0.0)
GPT2 = {"name": "gpt2"}
CHOICE, PASSAGES, GENERATE = "gptlab_tiny_choice", "gptlab_tiny_passages", "gptlab_tiny_generate"
LONG_TEXT = " ".join(json.loads(line)["text"] for line in (TASKS / "passages.jsonl").read_text().splitlines())
DOCS = [json.loads(line) for line in (TASKS / "choice.jsonl").read_text().splitlines()]


def choice_pairs():
    """(context, continuation) of every choice, as the harness asks (its target_delimiter is a space)."""
    return [(doc["question"] + " ", choice) for doc in DOCS for choice in doc["choices"]]


def save_run(run_dir: Path, model: GPT, tokenizer: dict = GPT2) -> Path:
    Checkpoints(run_dir).save(1, model, {"model": asdict(model.config), "data": {}, "tokenizer": tokenizer}, state={})
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run directories of random tiny models: GQA, the same pooled to MQA, and MHA."""
    root = tmp_path_factory.mktemp("lm_eval")
    gqa = randomized(GPT(GPTConfig(n_kv_head=2, **SHAPE)), seed=1)
    mqa_config, mqa_state = pool_kv_heads(gqa.state_dict(), gqa.config, 1)
    mqa = GPT(mqa_config)
    mqa.load_state_dict(mqa_state)
    mha = randomized(GPT(GPTConfig(**SHAPE)), seed=2)
    return {name: save_run(root / name, model) for name, model in (("GQA", gqa), ("MQA", mqa), ("MHA", mha))}


@pytest.fixture(scope="module")
def tasks():
    """Our tasks only (not the harness's thousands); their data_files are relative to the repository."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(REPO)
        yield TaskManager(include_path=str(TASKS), include_defaults=False)


@pytest.fixture(scope="module")
def gqa(runs):
    return GptlabLM(checkpoint=str(runs["GQA"]), device="cpu", batch_size=8)


@pytest.fixture(scope="module")
def harness_hf(runs, tmp_path_factory):
    """The harness's `hf` model on the transformers export of a run (GPT2LMHeadModel for
    MHA, GPTBigCodeForCausalLM for MQA), made once per layout."""
    root = tmp_path_factory.mktemp("hf")

    @cache
    def model_of(layout):
        export.main([str(runs[layout]), str(root / layout)])
        return get_model("hf")(pretrained=str(root / layout), device="cpu", dtype="float32")

    return model_of


def evaluate(model, tasks, names, **model_args):
    return lm_eval.simple_evaluate(
        model=model, model_args=model_args or None, tasks=names, task_manager=tasks, log_samples=True, verbosity="ERROR"
    )


def responses(result, task):
    """Per request, in document order: the harness's raw answer (a (loglikelihood,
    is_greedy) pair, a rolling loglikelihood or a text)."""
    samples = sorted(result["samples"][task], key=lambda sample: sample["doc_id"])
    return [response[0] for sample in samples for response in sample["resps"]]


@pytest.mark.parametrize("layout", ["MHA", "MQA"])
def test_same_loglikelihoods_and_accuracy_as_transformers_through_the_harness(runs, tasks, harness_hf, layout):
    ours = evaluate("gptlab", tasks, [CHOICE, PASSAGES], checkpoint=str(runs[layout]), device="cpu")
    theirs = evaluate(harness_hf(layout), tasks, [CHOICE, PASSAGES])
    for (our_logprob, our_greedy), (logprob, greedy) in zip(
        responses(ours, CHOICE), responses(theirs, CHOICE), strict=True
    ):
        assert our_logprob == pytest.approx(logprob, abs=1e-4) and our_greedy == greedy
    assert responses(ours, PASSAGES) == pytest.approx(responses(theirs, PASSAGES), abs=1e-3, rel=1e-6)
    for metric in ("acc,none", "acc_norm,none"):
        assert ours["results"][CHOICE][metric] == theirs["results"][CHOICE][metric]


def test_a_checkpoint_trained_on_its_own_bpe_is_read_with_that_tokenizer(tmp_path):
    tokenizer = train_bpe([LONG_TEXT], 320)
    model = randomized(GPT(GPTConfig(**{**SHAPE, "vocab_size": 320})), seed=3)
    Checkpoints(tmp_path).save(
        1,
        model,
        {"model": asdict(model.config), "data": {}, "tokenizer": tokenizer.describe()},
        state={},
        files=tokenizer.files(),
    )
    lm = GptlabLM(checkpoint=str(tmp_path), device="cpu")
    assert lm.tok_encode(LONG_TEXT) == tokenizer.encode(LONG_TEXT) and lm.eot_token_id == tokenizer.eot_id == 319


def test_grouped_query_loglikelihoods_equal_the_full_forward_pass(runs, gqa):
    tokenizer = load_tokenizer(GPT2)
    model = GPT(load_checkpoint(runs["GQA"] / "checkpoints" / "latest").model_config)
    model.load_state_dict(gqa.model.state_dict())
    pairs = [(context.rstrip(" "), " " + continuation) for context, continuation in choice_pairs()]
    expected = []
    for context, continuation in pairs:
        whole = tokenizer.encode(context + continuation)
        n = len(whole) - len(tokenizer.encode(context))
        logprobs = F.log_softmax(model.eval()(torch.tensor([whole]))[0][0, :-1], dim=-1)
        expected.append(logprobs[-n:].gather(1, torch.tensor(whole[-n:])[:, None]).sum().item())
    actual = [logprob for logprob, _ in gqa.loglikelihood(requests("loglikelihood", pairs))]
    assert actual == pytest.approx(expected, abs=1e-4)


def test_rolling_loglikelihood_predicts_each_token_once_in_windows_of_the_context_length(gqa):
    ids = gqa.tok_encode(LONG_TEXT)
    assert len(ids) > 2 * BLOCK and len(ids) % BLOCK  # two whole windows and a shorter one
    full = [gqa.eot_token_id] + ids  # the first token is predicted from <|endoftext|>
    expected = 0.0
    with torch.no_grad():
        for start in range(0, len(ids), BLOCK):  # stride: the context length
            end = min(start + BLOCK, len(ids))  # ids[start:end] are predicted from the BLOCK tokens before the last
            logprobs = F.log_softmax(gqa.model(torch.tensor([full[max(0, end - BLOCK) : end]]))[0][0], dim=-1)
            targets = torch.tensor(full[start + 1 : end + 1])
            expected += logprobs[-len(targets) :].gather(1, targets[:, None]).sum().item()
    assert gqa.loglikelihood_rolling(requests("loglikelihood_rolling", [(LONG_TEXT,)])) == pytest.approx([expected])


def test_generation_ends_at_a_stop_string_that_spans_two_tokens(gqa):
    prompt, settings = "The harbour was", {"until": [], "max_gen_toks": 24, "do_sample": False}
    (tokens,) = generate(gqa.model, [gqa.tok_encode(prompt)], 24, Sampling(temperature=0.0), vocab_size=50257)
    decode = gqa.text_tokenizer.decode
    free = decode(tokens)
    # The first k whose stop string (two characters of token k-1 and two of token k) first occurs there.
    k, stop = next(
        (k, free[b - 2 : b + 2])
        for k in range(1, len(tokens))
        for b in [len(decode(tokens[:k]))]
        if min(len(decode(tokens[k - 1 : k])), len(decode(tokens[k : k + 1]))) >= 2
        and free.find(free[b - 2 : b + 2]) == b - 2
    )
    calls = []
    hook = gqa.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        stopped = gqa.generate_until(
            requests(
                "generate_until",
                [
                    (prompt, {**settings, "until": [stop, "never generated"]}),
                    (prompt, {**settings, "until": "never generated"}),  # a string, as tasks may give
                ],
            )
        )
    finally:
        hook.remove()
    assert stopped == [free[: free.find(stop)], free]
    assert len(calls) == (1 + k) + (1 + 23)  # a prefill, then a step per further token: k + 1 tokens, then 24


def test_batch_size_and_padding_do_not_change_loglikelihoods(runs, gqa):
    pairs = choice_pairs() + [(LONG_TEXT, " and more."), ("", "An empty context.")]
    one = GptlabLM(checkpoint=str(runs["GQA"]), device="cpu", batch_size="1")  # as the command line passes it
    batched = gqa.loglikelihood(requests("loglikelihood", pairs))
    single = one.loglikelihood(requests("loglikelihood", pairs))
    assert [greedy for _, greedy in batched] == [greedy for _, greedy in single]
    # Equal up to fp32 rounding: a matmul's kernel, so its summation order, depends on the batch's shape.
    assert [logprob for logprob, _ in batched] == pytest.approx([logprob for logprob, _ in single], rel=1e-6, abs=1e-5)


def test_tasks_run_through_simple_evaluate_by_the_registered_name(runs, tasks):
    assert get_model("gptlab") is GptlabLM
    result = evaluate("gptlab", tasks, ["gptlab_tiny"], checkpoint=str(runs["GQA"]), device="cpu", batch_size=4)
    assert set(result["results"]) == {CHOICE, PASSAGES, GENERATE}
    generated = responses(result, GENERATE)
    assert len(generated) == 6 and not any("." in text or "\n" in text for text in generated)


def test_a_char_model_names_the_characters_its_vocabulary_lacks(tmp_path):
    chars = {"name": "char", "chars": "abc \n", "eot": False}
    run = save_run(tmp_path / "char", GPT(GPTConfig(**{**SHAPE, "vocab_size": 5})), chars)
    lm = GptlabLM(checkpoint=str(run), device="cpu")
    assert lm.loglikelihood(requests("loglikelihood", [("ab", "c")]))[0][1] in (True, False)
    with pytest.raises(ValueError, match=r"does not know: 'd' 'z'"):
        lm.loglikelihood(requests("loglikelihood", [("zab", "cd")]))


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"batch_size": "auto"}, "batch_size must be a whole number"),
        ({"weights": "fp8"}, "weights must be one of fp32, bf16, int8"),
    ],
)
def test_a_bad_model_arg_is_refused_in_one_line(runs, setting, message):
    with pytest.raises(ValueError, match=message):
        GptlabLM(checkpoint=str(runs["GQA"]), device="cpu", **setting)


def requests(kind, arguments):
    return [Instance(kind, doc={}, arguments=args, idx=0) for args in arguments]


def test_downstream_writes_each_tasks_figures_beside_the_checkpoint(runs, tasks, gqa, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", partial(TaskManager, include_defaults=False))  # fast
    settings = dict(checkpoint=str(runs["GQA"]), include_path=str(TASKS), device="cpu")
    downstream.evaluate(DownstreamConfig(tasks=[CHOICE], **settings))
    path = downstream.evaluate(DownstreamConfig(tasks=[PASSAGES], limit=2, **settings))  # added beside the first
    assert path == (runs["GQA"] / "checkpoints" / "latest").resolve() / "downstream.json"
    results = json.loads(path.read_text())
    assert results[PASSAGES]["items"] == 2 and results[PASSAGES]["limit"] == 2
    scores = [logprob for logprob, _ in gqa.loglikelihood(requests("loglikelihood", choice_pairs()))]
    right = [max(range(3), key=lambda i, n=n: scores[3 * n + i]) == doc["label"] for n, doc in enumerate(DOCS)]
    assert results[CHOICE]["metrics"]["acc"] == pytest.approx(sum(right) / len(DOCS))
    assert results[CHOICE]["items"] == len(DOCS) and results[CHOICE]["num_fewshot"] == 0


def finished_job(run_dir, mode):
    """What Hydra hands a callback when a job of train.py ends: its config, and main's return
    (the run directory)."""
    config = OmegaConf.create(
        {
            "out_dir": None,
            "runs_root": str(run_dir.parent),
            "device": "cpu",
            "hydra": {"mode": mode, "runtime": {"output_dir": str(run_dir.parent)}},
        }
    )
    return config, JobReturn(status=JobStatus.COMPLETED, _return_value=run_dir)


@pytest.mark.parametrize("mode", [RunMode.MULTIRUN, RunMode.RUN])
def test_the_callback_scores_the_run_its_job_wrote(runs, tasks, monkeypatch, mode):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", partial(TaskManager, include_defaults=False))
    callback = DownstreamAfterTraining(tasks=[CHOICE], include_path=str(TASKS))
    config, job = finished_job(runs["MQA"], mode)  # not the newest run under runs_root (MHA)
    callback.on_job_end(config=config, job_return=job)
    results = json.loads((runs["MQA"] / "checkpoints" / "latest" / "downstream.json").read_text())
    assert results[CHOICE]["items"] == 6
    monkeypatch.setenv("RANK", "1")  # torchrun's other ranks leave it to rank 0
    callback = DownstreamAfterTraining(tasks=[PASSAGES], include_path=str(TASKS))
    callback.on_job_end(config=config, job_return=job)
    assert PASSAGES not in json.loads((runs["MQA"] / "checkpoints" / "latest" / "downstream.json").read_text())


def test_the_gpt2_ablation_scores_hellaswag_after_each_run():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("train", ["experiment=attention_ablation_gpt2"], return_hydra_config=True)
    callback = instantiate(cfg.hydra.callbacks.downstream)
    assert isinstance(callback, DownstreamAfterTraining) and callback.settings["tasks"] == ["hellaswag"]


def test_a_request_longer_than_the_context_is_cut_as_the_harness_hf_model_cuts_it(runs, harness_hf):
    """Both keep the last block_size + 1 tokens of context + continuation; the harness's
    `hf` model on the transformers export of the same weights is the reference."""
    ours, theirs = GptlabLM(checkpoint=str(runs["MHA"]), device="cpu"), harness_hf("MHA")
    pairs = [(LONG_TEXT, " and more."), (LONG_TEXT[:400], LONG_TEXT[400:550])]  # continuations of 3 and ~30 tokens
    assert all(len(ours.tok_encode(context + continuation)) > BLOCK + 1 for context, continuation in pairs)
    expected = theirs.loglikelihood(requests("loglikelihood", pairs))
    actual = ours.loglikelihood(requests("loglikelihood", pairs))
    assert [logprob for logprob, _ in actual] == pytest.approx([logprob for logprob, _ in expected], abs=1e-4)
    assert [greedy for _, greedy in actual] == [greedy for _, greedy in expected]


def test_generation_from_a_context_longer_than_the_model_keeps_its_end(gqa, monkeypatch):
    """As the harness's `hf` model does, the newest tokens are kept: what the model reads last
    is what it continues."""
    prompts = []

    def recording_generate(model, batch, *args, **kwargs):
        prompts.extend(batch)
        return generate(model, batch, *args, **kwargs)

    monkeypatch.setattr(lm_module, "generate", recording_generate)
    gqa.generate_until(requests("generate_until", [(LONG_TEXT, {"until": [], "max_gen_toks": 2})]))
    tokens = gqa.tok_encode(LONG_TEXT)
    assert len(tokens) > gqa.max_length and prompts == [tokens[-gqa.max_length :]]


@pytest.mark.parametrize("tokenizer, start", [(GPT2, 50256), ({"name": "char", "chars": "ab \n", "eot": False}, 3)])
def test_an_empty_context_generates_from_endoftext_or_else_a_newline(tmp_path, tokenizer, start):
    """As sample.py does with an empty prompt: <|endoftext|>, or the newline of a char
    tokenizer that has no <|endoftext|> (its id 3 here)."""
    vocab = load_tokenizer(tokenizer).vocab_size
    model = randomized(GPT(GPTConfig(**{**SHAPE, "vocab_size": vocab})), seed=4)
    lm = GptlabLM(checkpoint=str(save_run(tmp_path / "run", model, tokenizer)), device="cpu")
    (tokens,) = generate(lm.model, [[start]], 12, Sampling(temperature=0.0), vocab_size=vocab)
    expected = lm.text_tokenizer.decode(tokens)
    assert lm.generate_until(requests("generate_until", [("", {"until": [], "max_gen_toks": 12})])) == [expected]
