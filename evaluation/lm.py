"""The lm-evaluation-harness model for gptlab checkpoints, registered as `gptlab`.

    lm = GptlabLM(checkpoint="runs/<run>", device="cpu", batch_size=8)
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

It loads any checkpoint with its tokenizer as sample.py does (load_model) and scores requests
as the harness's transformers model (`hf`) does, so the figures compare: loglikelihood sums the
continuation's log-probabilities over the whole (padded) vocabulary, context and continuation
encoded together and split on token ids, the last block_size + 1 tokens kept; loglikelihood_rolling
predicts every token once, in windows of block_size; generate_until runs the KV-cached engine,
greedy unless the task sets do_sample, to <|endoftext|>, max_gen_toks (256) or the first stop
string (left out). Batches run longest first, right-padded (causal attention keeps the padding
from changing the results). An empty context is <|endoftext|> (a newline for a char tokenizer).
"""

from __future__ import annotations

import json
from typing import Any

import lm_eval.models  # noqa: F401  the harness's own models: its registry fills itself only while empty
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from model import Sampling, cut_at_stop, generate, stop_string_check
from run.load import load_model
from run.runtime import resolve_device, resolve_precision

GENERATION_SETTINGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")
MAX_GEN_TOKS = 256  # the harness's own default


@register_model("gptlab")
class GptlabLM(TemplateLM):
    def __init__(
        self,
        checkpoint: str | None = None,
        runs_root: str = "runs",
        device: str | None = "auto",
        precision: str = "fp32",
        weights: str = "fp32",
        batch_size: int | str = 8,
    ) -> None:
        """checkpoint: a checkpoint or run directory (None: the newest run under runs_root);
        precision: the activations' (fp32 as the harness's transformers model; bf16, fp16 or auto
        for speed); weights: fp32, bf16 or int8 (CPU only), as for sample.py."""
        super().__init__()
        self.batch_size = _positive_int(batch_size)
        self._device = resolve_device(device or "auto")
        self.model, self.text_tokenizer, self.checkpoint = load_model(
            checkpoint, runs_root, self._device, resolve_precision(precision, self._device).dtype, weights=weights
        )
        self.max_length = self.model.config.block_size

    @property
    def eot_token_id(self) -> int:
        eot = self.text_tokenizer.eot_id
        return eot if eot is not None else self.tok_encode("\n")[0]

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        try:
            return self.text_tokenizer.encode(string)
        except ValueError:  # only a char tokenizer refuses text
            missing = " ".join(repr(c) for c in self.text_tokenizer.unknown_characters(string))
            raise ValueError(
                f"the task's text has characters that the {self.text_tokenizer.name} tokenizer of "
                f"{self.checkpoint.path} does not know: {missing} (its vocabulary is the characters of its "
                "training text); evaluate it on tasks whose text they cover, or train with data.tokenizer=gpt2"
            ) from None

    def _loglikelihood_tokens(
        self, requests: list[tuple[tuple[str, str], list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        sequences = [(context + continuation)[-(self.max_length + 1) :] for _, context, continuation in requests]
        results = self._score(sequences, [len(continuation) for _, _, continuation in requests], disable_tqdm)
        for (pair, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows, scored, owners = [], [], []
        for owner, request in enumerate(requests):
            (text,) = request.args
            pairs = get_rolling_token_windows(self.tok_encode(text), self.prefix_token_id, self.max_length, 1)
            for context, predicted in map(make_disjoint_window, pairs):
                windows.append(context + predicted)
                scored.append(len(predicted))
                owners.append(owner)
        totals = [0.0] * len(requests)
        for owner, (logprob, _) in zip(owners, self._score(windows, scored, disable_tqdm)):
            totals[owner] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}  # requests with the same settings, generated together
        for index, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(index)
        texts = [""] * len(requests)
        batches = [
            (indices[start : start + self.batch_size], requests[indices[0]].args[1])
            for indices in groups.values()
            for start in range(0, len(indices), self.batch_size)
        ]
        for batch, settings in tqdm(batches, disable=disable_tqdm, desc="gptlab generate_until"):
            for index, text in zip(batch, self._generate([requests[i].args[0] for i in batch], settings)):
                texts[index] = text
                self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return texts

    def _generate(self, contexts: list[str], settings: dict[str, Any]) -> list[str]:
        """Continuations of contexts under one request's generation settings."""
        if unknown := sorted(set(settings) - set(GENERATION_SETTINGS)):
            raise ValueError(
                f"the task asks for generation settings the gptlab model does not have: {unknown} "
                f"(it takes {', '.join(GENERATION_SETTINGS)})"
            )
        until = settings.get("until") or []
        stops = [stop for stop in ([until] if isinstance(until, str) else until) if stop]
        sampling = Sampling(temperature=0.0)  # greedy, as the harness's transformers model
        if settings.get("do_sample"):
            get = settings.get
            sampling = Sampling(float(get("temperature", 1.0)), get("top_k"), float(get("top_p", 1.0)))
        prompts = [
            (self.tok_encode(context) if context else [self.prefix_token_id])[-self.max_length :]
            for context in contexts
        ]
        tokenizer, steps = self.text_tokenizer, int(settings.get("max_gen_toks", MAX_GEN_TOKS))
        eots, stop = [] if tokenizer.eot_id is None else [tokenizer.eot_id], stop_string_check(tokenizer.decode, stops)
        outputs = generate(
            self.model, prompts, steps, sampling, stop_tokens=eots, stop=stop, vocab_size=tokenizer.vocab_size
        )
        return [cut_at_stop(tokenizer.decode(tokens), stops)[0] for tokens in outputs]

    @torch.inference_mode()
    def _score(self, sequences: list[list[int]], scored: list[int], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """Per token sequence: the summed log-probability of its last `scored` tokens, each
        given the tokens before it, and whether every one of them was the most likely."""
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(sequences)
        for start in tqdm(range(0, len(order), self.batch_size), disable=disable_tqdm, desc="gptlab loglikelihood"):
            rows = order[start : start + self.batch_size]
            batch = pad_sequence([torch.tensor(sequences[i][:-1], dtype=torch.long) for i in rows], batch_first=True)
            logits, _ = self.model(batch.to(self._device))  # right-padded
            for row, i in enumerate(rows):
                results[i] = _continuation_score(logits[row], sequences[i], scored[i])
        return results


def _continuation_score(logits: torch.Tensor, sequence: list[int], scored: int) -> tuple[float, bool]:
    """logits (T, vocab) of sequence[:-1] (then padding): the summed log-probability of the
    last `scored` tokens of sequence and whether each was the argmax."""
    n = min(scored, len(sequence) - 1)
    if n == 0:
        return 0.0, True
    end = len(sequence) - 1
    logprobs = F.log_softmax(logits[end - n : end].float(), dim=-1)
    targets = torch.tensor(sequence[-n:], device=logits.device)
    total = logprobs.gather(1, targets[:, None]).sum().item()
    return total, bool((logprobs.argmax(dim=-1) == targets).all())


def _positive_int(value: int | str) -> int:
    try:
        size = int(value)
    except (TypeError, ValueError):
        size = 0
    if size < 1:
        raise ValueError(
            f"batch_size must be a whole number of at least 1 for the gptlab model, got {value!r} "
            "(auto is not supported)"
        )
    return size
