"""The markdown of a GPU acceptance run (bench/gpu_check.py): stages, figures, targets."""

from __future__ import annotations

TARGET_SPEEDUP, TARGET_MFU = 1.1, 0.45  # compiled gptlab over the compiled reference; MFU at dense bf16
GRAPH_SPEEDUP = 3  # batch-1 decode replayed as a CUDA graph over eager


def render(report: dict) -> str:
    env = _result(report, "environment") or {}
    where = env.get("gpu") or f"CPU ({env.get('cpu', '?')}), smoke run"
    lines = [f"# GPU acceptance run: {where}", "",
             f"{report['date']} | torch {env.get('torch', '?')} | CUDA {env.get('cuda', '-')} | "
             f"driver {env.get('driver', '-')} | {env.get('memory_gib', '-')} GiB", "",
             "| stage | result | seconds |", "|---|---|--:|"]
    for name, stage in report.items():
        if isinstance(stage, dict) and "ok" in stage:
            result = "ok" if stage["ok"] else "FAILED: " + stage["error"].splitlines()[0][:160]
            lines.append(f"| {name} | {result} | {stage['seconds']} |")
    for section in (_sdpa(env), _tests(report), _train(report), _throughput(report), _decode(report), _targets(report)):
        if section:
            lines += ["", *section]
    return "\n".join(lines) + "\n"


def _result(report: dict, name: str):
    stage = report.get(name)
    return stage["result"] if stage and stage.get("ok") else None


def _sdpa(env: dict) -> list[str]:
    table = env.get("sdpa")
    if not table:
        return []
    backends = list(next(iter(table.values())))
    lines = ["## SDPA backends for gptlab's attention calls", "",
             "| call | " + " | ".join(backends) + " |", "|---|" + "---|" * len(backends)]
    for call, results in table.items():
        lines.append(f"| {call} | " + " | ".join("yes" if results[b] == "ok" else "no" for b in backends) + " |")
    return lines


def _tests(report: dict) -> list[str]:
    result = _result(report, "cuda_tests")
    return ["## CUDA tests (`python -m pytest -m cuda`)", "", result["summary"]] if result else []


def _train(report: dict) -> list[str]:
    result = _result(report, "train")
    if not result:
        return []
    checks = ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in result["checks"].items())
    losses = ", ".join(f"{step}: {loss}" for step, loss in result["val_loss"])
    return ["## train.py, resumed, then sample.py", "", checks, "",
            f"val loss by step: {losses}; last train tokens/s: {result['tok_per_s_last']:,.0f}; "
            f"seconds: {result['seconds']}"]


def _throughput(report: dict) -> list[str]:
    rows = _result(report, "throughput")
    if not rows:
        return []
    lines = ["## Training throughput", "",
             "| attention | variant | batch x context | tokens/s | MFU | vs reference | peak GiB | recompiles | graph breaks |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(
            f"| {r['attention']} | {r['variant']} | {r['batch']} x {r['context']} | {r['tokens_per_s']:,} | "
            f"{_percent(r['mfu'])} | {_times(r['over_reference'])} | {_or_dash(r['peak_memory_gib'])} | "
            f"{_or_dash(r['recompiles_after_warmup'])} | {_or_dash(r['graph_breaks'])} |")
    return lines


def _decode(report: dict) -> list[str]:
    rows = _result(report, "decode")
    if not rows:
        return []
    graph = rows[0].get("graph_mode", "graph")
    lines = ["## KV-cached decode (greedy)", "",
             f"| attention | batch | context | eager ms/token | eager tokens/s | {graph} ms/token | {graph} tokens/s "
             f"| {graph} / eager | KV cache MiB (full context) |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['attention']} | {r['batch']} | {r['context']} | {r['ms_per_token']} | {r['tokens_per_s']:,} | "
                     f"{_or_dash(r.get('graph_ms_per_token'))} | {_or_dash(r.get('graph_tokens_per_s'))} | "
                     f"{_times(r.get('graph_over_eager'))} | {r['kv_cache_bytes_full_context'] / 2**20:,.2f} |")
    return lines


def _targets(report: dict) -> list[str]:
    lines = []
    train_rows = _result(report, "throughput") or []
    mha = {r["variant"]: r for r in train_rows if r["attention"] == "MHA"}
    if "gptlab-compiled" in mha:
        compiled = mha["gptlab-compiled"]
        lines.append(_target(f"compiled gptlab >= {TARGET_SPEEDUP}x the compiled reference",
                             compiled["over_reference"], compiled["over_reference"] is not None
                             and compiled["over_reference"] >= TARGET_SPEEDUP, _times))
        lines.append(_target(f"MFU >= {TARGET_MFU:.0%} (compiled, MHA)", compiled["mfu"],
                             compiled["mfu"] is not None and compiled["mfu"] >= TARGET_MFU, _percent))
    compiled_rows = [r for r in train_rows if r["recompiles_after_warmup"] is not None]
    if compiled_rows:
        recompiles = sum(r["recompiles_after_warmup"] for r in compiled_rows)
        breaks = sum(r["graph_breaks"] or 0 for r in compiled_rows)
        lines.append(_target("no recompilation after warm-up", recompiles, recompiles == 0, str))
        lines.append(_target("no graph break in the model's forward", breaks, breaks == 0, str))
    decode_rows = _result(report, "decode") or []
    if decode_rows:
        batch, context = max(r["batch"] for r in decode_rows), max(r["context"] for r in decode_rows)
        at = {r["attention"]: r for r in decode_rows if (r["batch"], r["context"]) == (batch, context)}
        if {"MHA", "MQA"} <= at.keys():
            speedup = at["MQA"]["tokens_per_s"] / at["MHA"]["tokens_per_s"]
            cache = at["MHA"]["kv_cache_bytes_full_context"] / at["MQA"]["kv_cache_bytes_full_context"]
            lines.append(_target(f"batch-{batch} MQA decode at context {context} faster than MHA "
                                 f"(cache {cache:.0f}x smaller)", speedup, speedup > 1, _times))
        lines += _graph_targets(decode_rows)
    return ["## Targets", "", *lines] if lines else []


def _graph_targets(rows: list[dict]) -> list[str]:
    """CUDA-graph decode >= GRAPH_SPEEDUP x eager at batch 1, the shortest context, per attention."""
    batch, context = min(r["batch"] for r in rows), min(r["context"] for r in rows)
    return [_target(f"batch-{batch} {r['graph_mode']} decode at context {context} >= {GRAPH_SPEEDUP}x eager ({r['attention']})",
                    r["graph_over_eager"], r["graph_over_eager"] >= GRAPH_SPEEDUP, _times)
            for r in rows if (r["batch"], r["context"]) == (batch, context) and r.get("graph_over_eager") is not None]


def _target(what: str, value, met: bool, fmt) -> str:
    return f"- {what}: {fmt(value) if value is not None else '-'} ({'met' if met else 'NOT met'})"


def _percent(value) -> str:
    return f"{100 * value:.1f}%" if value is not None else "-"


def _times(value) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _or_dash(value) -> str:
    return "-" if value is None else str(value)
