"""The report of a GPU acceptance run (bench/gpu_check.py): its markdown (stages, figures,
targets, and the command that runs what is missing), rendered at any point of the run, and
the Recorder that saves it after every stage and every row."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

from bench.time_to_loss import markdown

TARGET_SPEEDUP, TARGET_MFU = 1.1, 0.45  # compiled gptlab over the compiled reference; MFU at dense bf16
GRAPH_SPEEDUP = 3  # batch-1 decode replayed as a CUDA graph over eager


def render(report: dict) -> str:
    env = _result(report, "environment") or {}
    where = env.get("gpu") or f"CPU ({env.get('cpu', '?')}), smoke run"
    versions = ", ".join(f"{name} {v}" for name, v in env.get("versions", {}).items() if v)
    lines = [
        f"# GPU acceptance run: {where}",
        "",
        f"{report['date']} | torch {env.get('torch', '?')} | CUDA {env.get('cuda', '-')} | "
        f"driver {env.get('driver', '-')} | {env.get('memory_gib', '-')} GiB | "
        f"compute mode {env.get('compute_mode', '-')}",
        "",
        *([versions, ""] if versions else []),
        "| stage | result | seconds |",
        "|---|---|--:|",
    ]
    for name in report["asked"]:
        lines.append(f"| {name} | {_stage_result(report.get(name))} | {report.get(name, {}).get('seconds', '-')} |")
    for section in (
        _sdpa(env),
        _throughput(report),
        _memory(report),
        _decode(report),
        _train(report),
        _tests(report),
        _time_to_loss(report),
        _targets(report),
        _missing(report),
    ):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"


def _stage_result(stage: dict | None) -> str:
    if stage is None:
        return "not run yet"
    if "running" in stage:
        return "running (or cut short)"
    if "skipped" in stage:
        return f"skipped: {stage['skipped']}"
    if "error" in stage:
        return "FAILED: " + _first_line(stage["error"])
    rows = stage["result"] if isinstance(stage["result"], list) else []
    failed = sum(any(key.endswith("error") for key in row) for row in rows)
    skipped = sum("skipped" in row for row in rows)
    notes = [f"{failed} of {len(rows)} rows FAILED"] * bool(failed) + [f"{skipped} skipped for the budget"] * bool(
        skipped
    )
    return "; ".join(notes) if failed else "; ".join(["ok", *notes])


def missing(report: dict) -> list[str]:
    """The asked stages without all their figures: not run, skipped, failed, or with rows skipped."""

    def complete(stage: dict | None) -> bool:
        rows = stage.get("result") if stage else None
        return (
            bool(stage) and stage["ok"] is True and not (isinstance(rows, list) and any("skipped" in r for r in rows))
        )

    return [name for name in report["asked"] if not complete(report.get(name))]


def _missing(report: dict) -> list[str]:
    names = missing(report)
    if not names:
        return []
    budget = f" --budget-s {report['budget_s']:g}" if report.get("budget_s") else ""
    smoke = " --smoke" if report["smoke"] else ""
    return [
        "## Missing",
        "",
        f"Stages without all their figures: {', '.join(names)}. To run only those:",
        "",
        f"    python bench/gpu_check.py{smoke} --out {shlex.quote(report.get('out', 'DIR'))}{budget} "
        f"--stages {' '.join(names)}",
    ]


def _result(report: dict, name: str):
    stage = report.get(name)
    return stage.get("result") if stage else None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0][:160] if text.strip() else "?"


def _sdpa(env: dict) -> list[str]:
    table = env.get("sdpa")
    if not table:
        return []
    backends = list(next(iter(table.values())))
    lines = [
        "## SDPA backends for gptlab's attention calls",
        "",
        "| call | " + " | ".join(backends) + " |",
        "|---|" + "---|" * len(backends),
    ]
    for call, results in table.items():
        lines.append(f"| {call} | " + " | ".join("yes" if results[b] == "ok" else "no" for b in backends) + " |")
    return lines


def _tests(report: dict) -> list[str]:
    result = _result(report, "cuda_tests")
    return ["## CUDA tests (`python -m pytest -m cuda`)", "", result["summary"]] if result else []


def _time_to_loss(report: dict) -> list[str]:
    result = _result(report, "time_to_loss")
    if not result:
        return []
    return [
        f"## The GPT-2 recipe against the modern one, {result['budget_s']:g} s of training each "
        "(`bench/time_to_loss.py`, one seed)",
        "",
        markdown(result["rows"]),
    ]


def _memory(report: dict) -> list[str]:
    result = _result(report, "memory")
    if not result:
        return []
    mode = lambda compiled: "compiled" if compiled else "eager"  # noqa: E731
    lines = [
        "## Training memory: the step's peak, and what fits (`bench/memory_fit.py`)",
        "",
        "| mode | micro-batch | peak GiB | arithmetic GiB |",
        "|---|--:|--:|--:|",
    ]
    gib = lambda count: "-" if count is None else f"{count / 2**30:.2f}"  # noqa: E731
    lines += [
        f"| {mode(r['compile'])} | {r['micro_batch']} | {gib(r['peak_bytes'])} | {gib(r['arithmetic_bytes'])} |"
        for r in result["rows"]
    ]
    arithmetic = {(r["compile"], r["card_gib"]): r["micro_batch"] for r in result["arithmetic"]}
    lines += ["", "| mode | card | largest micro-batch: measured line | arithmetic |", "|---|--:|--:|--:|"]
    lines += [
        f"| {mode(f['compile'])} | {f['card_gib']} GiB | {_or_dash(f['measured'])} | "
        f"{_or_dash(arithmetic[f['compile'], f['card_gib']])} |"
        for f in result["fits"]
    ]
    return lines


def _train(report: dict) -> list[str]:
    result = _result(report, "train")
    if not result:
        return []
    checks = ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in result["checks"].items())
    losses = ", ".join(f"{step}: {loss}" for step, loss in result["val_loss"])
    return [
        "## train.py, resumed, then sample.py",
        "",
        checks,
        "",
        f"val loss by step: {losses}; last train tokens/s: {result['tok_per_s_last']:,.0f}; "
        f"seconds: {result['seconds']}",
    ]


def _throughput(report: dict) -> list[str]:
    rows = _result(report, "throughput")
    if not rows:
        return []
    matmul = next((r["matmul_flops"] for r in rows if "matmul_flops" in r), None)
    lines = [
        "## Training throughput",
        "",
        "MFU is against the datasheet's dense peak; 'of matmul' against the rate of a large matrix product "
        f"measured on the same device in the same precision ({_or_dash(matmul and f'{matmul / 1e12:,.1f}')} TFLOP/s).",
        "",
        "| attention | variant | batch x context | tokens/s | MFU | of matmul | vs reference | peak GiB "
        "| recompiles | graph breaks |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if "tokens_per_s" not in r:
            why = f"skipped: {r['skipped']}" if "skipped" in r else "FAILED: " + _first_line(r["error"])
            lines.append(f"| {r['attention']} | {r.get('variant', 'all')} | {why} |" + " |" * 7)
            continue
        lines.append(
            f"| {r['attention']} | {r['variant']} | {r['batch']} x {r['context']} | {r['tokens_per_s']:,} | "
            f"{_percent(r.get('mfu'))} | {_percent(r.get('of_matmul'))} | {_times(r.get('over_reference'))} | "
            f"{_or_dash(r['peak_memory_gib'])} | {_or_dash(r.get('recompiles_after_warmup'))} | "
            f"{_or_dash(r.get('graph_breaks'))} |"
        )
    return lines


def _decode(report: dict) -> list[str]:
    rows = _result(report, "decode")
    if not rows:
        return []
    graph = next((r["graph_mode"] for r in rows if "graph_mode" in r), "graph")
    lines = [
        "## KV-cached decode (greedy)",
        "",
        f"| attention | batch | context | eager ms/token | eager tokens/s | {graph} ms/token | {graph} tokens/s "
        f"| {graph} / eager | KV cache MiB (full context) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['attention']} | skipped: {r['skipped']} |" + " |" * 7)
            continue
        eager = _mode_cells(r, "", "eager_error")
        graphed = _mode_cells(r, "graph_", "graph_error")
        lines.append(
            f"| {r['attention']} | {r['batch']} | {r['context']} | {eager} | {graphed} | "
            f"{_times(r.get('graph_over_eager'))} | {r['kv_cache_bytes_full_context'] / 2**20:,.2f} |"
        )
    return lines


def _mode_cells(row: dict, prefix: str, error: str) -> str:
    """The ms/token and tokens/s cells of one decode mode, or its error across both."""
    if error in row:
        return f"FAILED: {_first_line(row[error])} | -"
    return f"{row[prefix + 'ms_per_token']} | {row[prefix + 'tokens_per_s']:,}"


def _targets(report: dict) -> list[str]:
    lines = []
    train_rows = [r for r in _result(report, "throughput") or [] if "tokens_per_s" in r]
    mha = {r["variant"]: r for r in train_rows if r["attention"] == "MHA"}
    if "gptlab-compiled" in mha:
        compiled = mha["gptlab-compiled"]
        speedup = compiled.get("over_reference")
        lines.append(
            _target(
                f"compiled gptlab >= {TARGET_SPEEDUP}x the compiled reference",
                speedup,
                speedup is not None and speedup >= TARGET_SPEEDUP,
                _times,
            )
        )
        lines.append(
            _target(
                f"MFU >= {TARGET_MFU:.0%} (compiled, MHA; of the measured matmul rate: "
                f"{_percent(compiled.get('of_matmul'))})",
                compiled.get("mfu"),
                compiled.get("mfu") is not None and compiled["mfu"] >= TARGET_MFU,
                _percent,
            )
        )
    compiled_rows = [r for r in train_rows if "recompiles_after_warmup" in r]
    if compiled_rows:
        recompiles = sum(r["recompiles_after_warmup"] for r in compiled_rows)
        breaks = sum(r.get("graph_breaks") or 0 for r in compiled_rows)
        lines.append(_target("no recompilation after warm-up", recompiles, recompiles == 0, str))
        lines.append(_target("no graph break in the model's forward", breaks, breaks == 0, str))
    lines += _decode_targets([r for r in _result(report, "decode") or [] if "tokens_per_s" in r])
    return ["## Targets", "", *lines] if lines else []


def _decode_targets(rows: list[dict]) -> list[str]:
    """MQA faster than MHA at the largest batch and context; CUDA-graph decode >= GRAPH_SPEEDUP x
    eager at batch 1 and the shortest context, per attention."""
    if not rows:
        return []
    lines = []
    batch, context = max(r["batch"] for r in rows), max(r["context"] for r in rows)
    at = {r["attention"]: r for r in rows if (r["batch"], r["context"]) == (batch, context)}
    if {"MHA", "MQA"} <= at.keys():
        speedup = at["MQA"]["tokens_per_s"] / at["MHA"]["tokens_per_s"]
        cache = at["MHA"]["kv_cache_bytes_full_context"] / at["MQA"]["kv_cache_bytes_full_context"]
        lines.append(
            _target(
                f"batch-{batch} MQA decode at context {context} faster than MHA (cache {cache:.0f}x smaller)",
                speedup,
                speedup > 1,
                _times,
            )
        )
    batch, context = min(r["batch"] for r in rows), min(r["context"] for r in rows)
    return lines + [
        _target(
            f"batch-{batch} {r['graph_mode']} decode at context {context} >= {GRAPH_SPEEDUP}x eager ({r['attention']})",
            r["graph_over_eager"],
            r["graph_over_eager"] >= GRAPH_SPEEDUP,
            _times,
        )
        for r in rows
        if (r["batch"], r["context"]) == (batch, context) and r.get("graph_over_eager") is not None
    ]


def _target(what: str, value, met: bool, fmt) -> str:
    return f"- {what}: {fmt(value) if value is not None else '-'} ({'met' if met else 'NOT met'})"


def _percent(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def _times(value) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


class Recorder:
    """The report: saved as gpu_check.json and gpu_check.md after every stage and every row."""

    def __init__(self, out: Path, report: dict, deadline: float) -> None:
        self.out, self.report, self.deadline = out, report, deadline

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def save(self) -> str:
        """Write both files (each whole or not at all: a kill mid-write leaves the last one), JSON
        first; return the markdown."""
        _replace(self.out / "gpu_check.json", json.dumps(self.report, indent=2, default=str))
        try:
            markdown = render(self.report)
        except Exception as err:  # the figures are safe in the JSON; say so instead of stopping the run
            markdown = f"# GPU acceptance run\n\nnot rendered ({type(err).__name__}: {err}): read gpu_check.json\n"
        _replace(self.out / "gpu_check.md", markdown)
        return markdown


def _replace(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)


class StageRows:
    """The rows sink of one measured stage (gpu_figures.Rows)."""

    def __init__(self, recorder: Recorder, rows: list[dict]) -> None:
        self.recorder, self.rows = recorder, rows

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.recorder.save()

    def left(self) -> float:
        return self.recorder.left()
