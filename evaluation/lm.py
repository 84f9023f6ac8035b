"""The lm-evaluation-harness model for gptlab checkpoints, registered as `gptlab`.

    lm = GptlabLM(checkpoint="runs/<run>", device="cpu", batch_size=8)
    lm_eval.simple_evaluate(model=lm, tasks=["hellaswag"])

It loads any checkpoint (a run directory or one step, any attention layout, any weight
format) with the tokenizer the model was trained with, through run/load.py's
load_model as sample.py does, and scores requests as the harness's own transformers
model (`hf`) does, so that the figures compare with any transformers model's:
- loglikelihood: context and continuation are encoded together and split on token ids
  (the harness's TemplateLM), the last block_size + 1 tokens are kept, and the
  continuation's log-probabilities are summed over the model's whole (padded) vocabulary;
  an empty context is <|endoftext|>.
- loglikelihood_rolling: every token of the text is predicted once, in windows of
  block_size predicted tokens (stride block_size): a window's input is the block_size
  tokens just before its last token, so a whole window sees its own tokens and the one
  before it (<|endoftext|> for the first), and the last, shorter one earlier text too.
- generate_until: the KV-cached engine (model/engine.py), greedy unless the task sets
  do_sample; a sample ends at <|endoftext|>, at max_gen_toks (256 by default), or at the
  first stop string (`until`), which is left out, even when it spans several tokens.
Scoring runs longest first in batches of batch_size, right-padded: causal attention keeps
padding after a token from changing it, so the batch size does not change the results.
A char tokenizer without <|endoftext|> starts from a newline instead, as sample.py does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import lm_eval.models  # noqa: F401  the harness's own models: its registry fills itself only while empty
import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
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
        precision: the activations' (fp32, as the harness's transformers model computes GPT-2;
        bf16 or fp16 for speed; auto: bf16 on CUDA that has it, else fp16; fp32 on a CPU);
        weights: fp32, bf16 or int8 (CPU only), as for sample.py."""
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
        unknown = sorted(set(settings) - set(GENERATION_SETTINGS))
        if unknown:
            raise ValueError(
                f"the task asks for generation settings the gptlab model does not have: {unknown} "
                f"(it takes {', '.join(GENERATION_SETTINGS)})"
            )
        until = settings.get("until") or []
        stops = [stop for stop in ([until] if isinstance(until, str) else until) if stop]
        sampling = Sampling(temperature=0.0)  # greedy, as the harness's transformers model
        if settings.get("do_sample"):
            sampling = Sampling(
                float(settings.get("temperature", 1.0)), settings.get("top_k"), float(settings.get("top_p", 1.0))
            )
        prompts = [
            (self.tok_encode(context) if context else [self.prefix_token_id])[-self.max_length :]
            for context in contexts
        ]
        eot = self.text_tokenizer.eot_id
        outputs = generate(
            self.model,
            prompts,
            int(settings.get("max_gen_toks", MAX_GEN_TOKS)),
            sampling,
            stop_tokens=[] if eot is None else [eot],
            stop=stop_string_check(self.text_tokenizer.decode, stops),
            vocab_size=self.text_tokenizer.vocab_size,
        )
        return [cut_at_stop(self.text_tokenizer.decode(tokens), stops)[0] for tokens in outputs]

    @torch.inference_mode()
    def _score(self, sequences: list[list[int]], scored: list[int], disable_tqdm: bool) -> list[tuple[float, bool]]:
        """Per token sequence: the summed log-probability of its last `scored` tokens, each
        given the tokens before it, and whether every one of them was the most likely."""
        order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
        results: list[tuple[float, bool]] = [(0.0, True)] * len(sequences)
        starts = range(0, len(order), self.batch_size)
        for start in tqdm(starts, disable=disable_tqdm, desc="gptlab loglikelihood"):
            rows = order[start : start + self.batch_size]
            logits, _ = self.model(self._right_padded([sequences[i][:-1] for i in rows]))
            for row, i in enumerate(rows):
                results[i] = _continuation_score(logits[row], sequences[i], scored[i])
        return results

    def _right_padded(self, rows: Sequence[list[int]]) -> torch.Tensor:
        batch = torch.zeros(len(rows), max(len(row) for row in rows), dtype=torch.long)
        for i, row in enumerate(rows):
            batch[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return batch.to(self._device)


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
