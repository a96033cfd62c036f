"""Per-step rendering cost: parse_completion + render_suffix, vs a naive full re-render, per family.

    .venv/bin/python bench/bench_render.py [--templates qwen2_5,glm4moe,...] [--steps 2000] [--turns 8]

For each template (default: one per supported family), a conversation of ``--turns`` tool rounds
is built; each step parses a completion (the template's own writing of a call) and renders the
suffix for a short tool output (what the server does per Step). The baseline is what many
stacks do instead: decode, apply_chat_template over the whole conversation so far (tokenize=True)
and take the new tail. Prints p50/p99 in ms (this thread's CPU time and wall time), the parse and
render parts of a step (CPU p50), the parse of a 2 KB code value that holds the family's own call
markup (the grammar's worst ordinary case), and the wall ratio to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from env_server.rendering import TokenizerRegistry  # noqa: E402
from env_server.rendering import messages as msgs  # noqa: E402
from tito.types import Message  # noqa: E402
from tests.rendering.helpers import TOOLS  # noqa: E402
from tito.fingerprint import read_tokenizer_files  # noqa: E402
from tito_assets.qwen_tokenizer import build_tokenizer_dir  # noqa: E402

# One template per supported family / wire format.
FAMILIES = ("qwen2_5,qwen3,qwen3_instruct_2507,qwen3_6,nemotron_3_nano,glm4moe,gemma4,gemma4_v2,lfm2_2_5,lfm2_v2,"
            "llama3_1,gptoss,muse_glimmer,deepseekv3,"
            "kimi_k2,minimax_m2,minimax_m1,mistral_nemo,mistral_small_3_2,devstral_small,ministral_3,seed_oss,"
            "llama4_json,llama4_pythonic,olmo3,xlam_qwen,qwen2_5_coder,internlm2,qwen3_coder,granite_4_0,"
            "kimi_k2_ids,kimi_k2_instruct,kimi_k2_thinking,phi4_mini,nemotron_nano_v2,apertus,muse_glimmer_vllm")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench(template: str, steps: int, turns: int, budget: int | None) -> dict:
    ctx = TokenizerRegistry().register(read_tokenizer_files(build_tokenizer_dir(template=template)), {})
    tok, style = ctx.tokenizer, ctx.rules.style
    conv = msgs.head(style, {"role": "user", "content": "Compute 6*7 with Python."})
    asst = msgs.assistant(style, [(style.call_id(1, 0, "run_python"), "run_python", {"code": "print(6*7)"})],
                          "I will run it." if style.reasoning_field else None)
    completion = ctx.encode(ctx.completion_text(conv, asst, TOOLS))
    output = "42\n"
    history = list(conv)
    for k in range(turns):
        history += [asst, msgs.tool("run_python", style.call_id(1, 0, "run_python"), output)]

    # A 2 KB code value holding the family's own writing of a call, several times: one call must come back.
    markup = ctx.completion_text(conv, asst, TOOLS).replace('<|"|>', "'")  # Gemma 4's strings cannot hold <|"|>
    code = ("doc = " + repr(markup) + "\n") * max(1, 2048 // (len(markup) + 8))
    heavy_turn = msgs.assistant(style, [(style.call_id(1, 0, "run_python"), "run_python", {"code": code})],
                                "I will run it." if style.reasoning_field else None)
    heavy = ctx.encode(ctx.completion_text(conv, heavy_turn, TOOLS))

    ours, cpu, parse_cpu, heavy_cpu = [], [], [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        parsed = ctx.parse_completion(completion, seq=1, tools=TOOLS)
        c1 = time.thread_time()
        results = [Message.tool_result(c, output) for c in parsed.tool_calls]
        ctx.render_suffix(parsed.tool_calls, results, budget, later_round=turns > 0, calls_before=turns)
        cpu.append((time.thread_time() - c0) * 1e3)
        parse_cpu.append((c1 - c0) * 1e3)
        ours.append((time.perf_counter() - t0) * 1e3)
    assert parsed.tool_calls and not parsed.tool_calls[0].error, parsed
    for _ in range(max(50, steps // 10)):
        c0 = time.thread_time()
        got = ctx.parse_completion(heavy, seq=1, tools=TOOLS).tool_calls
        heavy_cpu.append((time.thread_time() - c0) * 1e3)
    if ctx.rules.uncarried:  # the template writes string values unescaped: a value holding its markup is refused
        assert [c.name for c in got] == ["run_python"] and "cannot write this call" in (got[0].error or ""), (
            template, got)
    else:
        assert [(c.name, c.error) for c in got] == [("run_python", None)] and \
            json.loads(got[0].arguments)["code"] == code, (template, got)
    base = []
    for _ in range(max(50, steps // 10)):
        t0 = time.perf_counter()
        tok.decode(completion)  # what a re-tokenizing stack does: decode, re-render, re-tokenize
        if ctx.template.mutates:  # transformers' sandbox refuses it (list.append): one render through tito's engine
            ctx.render_conversation(history, TOOLS, add_generation_prompt=True)
        else:
            tok.apply_chat_template(history, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)
        base.append((time.perf_counter() - t0) * 1e3)
    return {"template": template, "family": ctx.family, "p50": statistics.median(ours), "p99": pct(ours, 0.99),
            "cpu_p50": statistics.median(cpu), "cpu_p99": pct(cpu, 0.99), "parse_p50": statistics.median(parse_cpu),
            "render_p50": statistics.median(cpu) - statistics.median(parse_cpu),
            "heavy_p50": statistics.median(heavy_cpu),
            "base_p50": statistics.median(base), "base_p99": pct(base, 0.99)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=FAMILIES)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=8, help="tool rounds already in the conversation (baseline cost)")
    ap.add_argument("--budget", type=int, default=4096, help="max_suffix_tokens (0: none)")
    args = ap.parse_args()
    print(f"per step = parse_completion + render_suffix (short output), {args.steps} steps; "
          f"baseline = decode + apply_chat_template(tokenize=True) over {args.turns} rounds")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; cpu = this thread's CPU time (what a step "
          "costs when the machine is shared), wall = elapsed")
    print(f"{'template':20} {'family':13} {'cpu p50':>8} {'cpu p99':>8} {'parse':>6} {'render':>6} {'2KB val':>7} "
          f"{'wall p50':>9} {'wall p99':>9} {'base p50':>9} {'base p99':>9} {'speedup':>8}")
    for template in args.templates.split(","):
        r = bench(template, args.steps, args.turns, args.budget or None)
        print(f"{r['template']:20} {r['family']:13} {r['cpu_p50']:8.3f} {r['cpu_p99']:8.3f} {r['parse_p50']:6.3f} "
              f"{r['render_p50']:6.3f} {r['heavy_p50']:7.3f} {r['p50']:9.3f} {r['p99']:9.3f} {r['base_p50']:9.3f} "
              f"{r['base_p99']:9.3f} {r['base_p50'] / r['p50']:7.1f}x", flush=True)


if __name__ == "__main__":
    main()
