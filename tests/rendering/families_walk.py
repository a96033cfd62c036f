"""Every pinned chat template (tito_assets/template_sources.toml: trl's, llama.cpp's and vLLM's published
templates, and the few this project wrote) through registration and, when accepted, through the token-exactness
cases.

    .venv/bin/python -m tests.rendering.families_walk      # regenerate docs/families.md

test_families.py runs the same walk and fails if docs/families.md is not what it produced, so the
list of supported families is generated from the test, never kept by hand.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from env_server.rendering import RenderingContext, UnsupportedTemplateError

from .helpers import REGISTRY, Turn, Walk, files_for, walk

DOC = Path(__file__).resolve().parents[2] / "docs" / "families.md"
PY = "run_python"

# Templates the walk does not register, and why.
VISION_ONLY = ("idefics3", "llava_next", "qwen2_5_vl", "smolvlm")
# Supported families: these must be accepted, every case exact or (deepseekv3, mistral_nemo, nemotron_nano_v2, apertus:
# the template rewrites its own history) suffix-exact.
MUST_ACCEPT = ("qwen2_5", "qwen3", "qwen3_instruct_2507", "llama3_1", "llama3_2", "gptoss", "qwen3_6",
               "nemotron_3_nano", "glm4moe", "gemma4", "lfm2_2_5", "deepseekv3",
               "kimi_k2", "minimax_m2", "minimax_m1", "mistral_nemo", "mistral_small_3_2", "devstral_small",
               "ministral_3", "seed_oss", "llama4_json", "llama4_pythonic", "olmo3", "qwen2_5_coder", "xlam_qwen",
               "internlm2", "qwen3_coder", "granite_4_0", "kimi_k2_ids", "kimi_k2_instruct", "kimi_k2_thinking",
               "phi4_mini", "nemotron_nano_v2", "nemotron_json", "apertus", "apertus_vllm", "muse_glimmer",
               "muse_glimmer_vllm")
TAIL_EXACT = ("suffix exact: the template renders earlier turns otherwise once later ones follow; ids are what the "
              "model saw at each round, each suffix the exact tail of the template's render")


def template_source(name: str) -> str:
    from tito_assets.template_sources import sources

    return sources()[name].describe()


def all_templates() -> list[str]:
    from tito_assets.qwen_tokenizer import available_templates

    return available_templates()


def skip_reason(name: str) -> str | None:
    if name.endswith("_training"):
        return f"trl's patched training copy of {name.removesuffix('_training')} (not what a model ships)"
    if name in VISION_ONLY:
        return "vision-only template (message content must be a list of image/text parts; no tool calling)"
    return None


# ---------------------------------------------------------------- the cases


def _resplit(ctx: RenderingContext, ids: list[int]) -> list[int]:
    """The same text tokenized differently: the longest ordinary token is spelled in smaller pieces."""
    special = {ctx.template.token_id(t) for t in ctx.template.added}
    i = max((j for j in range(len(ids)) if ids[j] not in special), key=lambda j: len(ctx.decode([ids[j]])))
    text = ctx.decode([ids[i]])
    pieces = [p for ch in text for p in ctx.template.encode_plain(ch)]
    if pieces == [ids[i]]:  # one character: split its bytes instead
        pieces = ctx.tokenizer.convert_tokens_to_ids(list(ctx.tokenizer.convert_ids_to_tokens([ids[i]])[0]))
    return ids[:i] + pieces + ids[i + 1:]


def _special_output(ctx: RenderingContext) -> Walk:
    # The control tokens: special tokens and added tokens the template writes (transformers' sanitize set).
    controls = ctx.tokenizer._get_control_tokens(ctx.template.source)
    w = walk(ctx, [Turn([(PY, {"code": "print(...)"})], [f"printed: {' '.join(controls)} end"])])
    plain = walk(ctx, [Turn([(PY, {"code": "print(...)"})], ["printed: end"])])
    specials = {ctx.template.token_id(t) for t in controls}
    # No control token appeared from the output: every literal was tokenized as text.
    assert sorted(t for t in w.suffixes[0].ids if t in specials) == sorted(
        t for t in plain.suffixes[0].ids if t in specials)
    return w


def _budget(ctx: RenderingContext) -> Walk:
    long = "".join(f"line {i}: {'x' * (i % 17)} ✓\n" for i in range(2000))
    w = walk(ctx, [Turn([(PY, {"code": "spam()"})], [long])], budget=200)
    s = w.suffixes[0]
    assert s.truncated and not s.overflow and 192 <= len(s.ids) <= 200
    assert "tokens truncated]" in s.tool_messages[0].content
    return w


def _parallel(ctx: RenderingContext) -> Walk | str:
    if ctx.rules.max_calls_per_turn == 1:
        return "n/a: the template renders one call per turn (further calls are answered with an error)"
    w = walk(ctx, [Turn([(PY, {"code": "1"}), ("lookup", {"word": "a"}), (PY, {"code": "2"})], ["1", "a: x", "2"])])
    text = ctx.decode(w.suffixes[0].ids)
    assert text.index("1") < text.index("a: x") < text.rindex("2")
    return w


def _three_rounds(ctx: RenderingContext) -> Walk:
    return walk(ctx, [
        Turn([(PY, {"code": "x = 2"})], [""]),
        Turn([("get_weather", {"city": "Paris", "zip": "75001", "days": 3})], ["sunny, 21C"]),
        Turn([("lookup", {"word": "naïve"})], ["x: a letter"]),
    ])


CASES: dict[str, Callable[[RenderingContext], Walk | str]] = {
    "one call": lambda ctx: walk(ctx, [Turn([(PY, {"code": "print(6 * 7)"})], ["42\n"])]),
    "parallel calls": _parallel,
    "unicode output": lambda ctx: walk(ctx, [Turn([(PY, {"code": "print('é')"})],
                                                  ["naïve café — 日本語 🙂🚀 e\u0301 \u200b"])]),
    "special-token strings in output": _special_output,
    "empty output": lambda ctx: walk(ctx, [Turn([(PY, {"code": "pass"})], [""])]),
    "three rounds": _three_rounds,
    "budget cut": _budget,
    "non-canonical split": lambda ctx: walk(ctx, [Turn([(PY, {"code": "print('hello world')"})], ["hello world\n"])],
                                            resplit=_resplit),
}


# ---------------------------------------------------------------- one template


@dataclass
class Row:
    template: str
    verdict: str  # accepted | refused | skipped
    family: str = ""
    wire: str = ""
    stops: str = ""
    detail: str = ""  # refusal or skip reason; notes for accepted ones
    cases: dict[str, str] = field(default_factory=dict)  # case -> "exact" | "n/a: ..."


def register(name: str) -> tuple[RenderingContext | None, str]:
    try:
        return REGISTRY.register(files_for(name), {}), ""
    except UnsupportedTemplateError as e:
        return None, str(e)


def run_template(name: str) -> Row:
    """Registration, then every case (an AssertionError propagates: a late failure fails the test)."""
    reason = skip_reason(name)
    if reason:
        return Row(name, "skipped", detail=reason)
    ctx, refusal = register(name)
    if ctx is None:
        assert "registration check" in refusal and len(refusal) > 60, f"uninformative refusal: {refusal!r}"
        return Row(name, "refused", detail=_short_reason(refusal))
    rules = ctx.rules
    stops = ", ".join(f"`{s}`" for s in rules.stop_tokens)
    boundary = f"call turn ends `{rules.boundary}`" + (" (opens the results)" if rules.opens_results else "")
    row = Row(name, "accepted", rules.name, rules.wire, f"{stops}; {boundary}", "; ".join(rules.notes + notes(ctx)))
    for case, run in CASES.items():
        try:
            out = run(ctx)
            row.cases[case] = out if isinstance(out, str) else TAIL_EXACT if out.rerendered else "exact"
        except AssertionError as e:
            raise AssertionError(f"{name}: case {case!r} failed after registration accepted it: {e}") from e
    return row


def notes(ctx: RenderingContext) -> tuple[str, ...]:
    """What registration found about a template beyond its family, for the table."""
    rules, out = ctx.rules, []
    if ctx.template.mutates:
        out.append(f"transformers' sandbox refuses its list .{'/.'.join(ctx.template.mutates)}: rendered by tito's engine "
                   "with list methods allowed (rendering/jinja_engine.py)")
    if rules.style.ids == "kimi":
        out.append("writes call ids, not names: tito's ids are functions.NAME:IDX")
    if ctx.counts_calls:
        out.append("numbers calls across the conversation: suffixes rendered after as many calls"
                   + (" (once per shape, outputs substituted: rendering/context.py)" if ctx.counted_by_substitution
                      else ""))
    if rules.rerenders_call_turn:
        out.append("renders the call turn otherwise once results follow: the suffix follows its end token as past "
                   "turns render it")
    if rules.boundary_closes_calls:
        out.append(f"{rules.boundary} closes the calls and ends the model's turn; the results follow inside it")
    if rules.style.tools_in_synthetic:
        out.append("renders the conversation otherwise without tools: synthetic renders carry one")
    if rules.style.system_in_synthetic:
        out.append("renders the conversation otherwise without a system message: synthetic renders open with one")
    return tuple(out)


def _short_reason(message: str) -> str:
    at = message.find("registration check")
    text = message[at:].split(". ")[0]
    return text if len(text) <= 240 else text[:239] + "…"


# ---------------------------------------------------------------- the table


def cases_summary(r: Row, with_na: bool = True) -> str:
    if not r.cases:
        return ""
    exact = sum(v == "exact" for v in r.cases.values())
    tail = sum(v == TAIL_EXACT for v in r.cases.values())
    na = [f"{k}: {v.removeprefix('n/a:').split(' (')[0].strip()}" for k, v in r.cases.items()
          if v not in ("exact", TAIL_EXACT)]
    return (f"{exact}/{len(r.cases)} exact" + (f", {tail} suffix-exact (the template rewrites history)" if tail else "")
            + (f", n/a: {'; '.join(na)}" if na and with_na else ""))


def markdown(rows: list[Row]) -> str:
    accepted = [r for r in rows if r.verdict == "accepted"]
    lines = [
        "# Supported chat-template families",
        "",
        "Generated by `tests/rendering/test_families.py` (regenerate: `.venv/bin/python -m tests.rendering.families_walk`);",
        "do not edit by hand. Every chat template pinned in `tito_assets/template_sources.toml` is registered with the",
        "offline Qwen-vocabulary tokenizer (`tito_assets`) plus the template's own control tokens: the templates",
        "published in trl's wheel (`chat_templates/`), in the llama-cpp-python sdist (llama.cpp's `models/templates/`)",
        "and in vLLM's sdist (`examples/`), fetched by `python -m tito_assets.fetch_templates` and checked by sha256",
        "(source, version and hash in the table), and three written for tito where no package publishes the family's",
        "template (marked \"ours\"). Accepted templates passed every case",
        f"({', '.join(CASES)}) token for token against the template's own render (where a template rewrites",
        "earlier turns once later ones follow, the ids are what the model saw at each round and every suffix is",
        "the exact tail of the template's render: \"suffix-exact\"); refused ones were refused at RegisterTokenizer",
        "with the reason shown. The parsers of the accepted families also pass the corpus of realistic outputs",
        "(`tests/rendering/corpus.py`: prose around calls, other whitespace, several calls, values holding the",
        "family's own markup or closing-tag-like lines, optional nulls, Python-literal and twice-encoded objects,",
        "malformed and truncated calls).",
        "",
        "Several calls in one turn run in order, except where the template renders one call per assistant message",
        "(Llama 3.1/3.2's templates raise on a second call, gpt-oss's renders the first): there the first call runs",
        "and each further one gets a tool message saying the format allows one call per turn.",
        "",
        "**Render engine.** Every template renders in transformers' Jinja configuration and sandbox (what",
        "`apply_chat_template` and vLLM use; tito's subclass of the sandbox answers five of its checks faster, with",
        "the same answers), at registration and at every Step alike. A template that calls a",
        "method changing a list it builds (`.append`, `.pop`: llama.cpp's Kimi K2 Instruct and Thinking copies, made",
        "for llama.cpp's engine) is refused by transformers' sandbox (`SecurityError`), so neither transformers nor",
        "vLLM can render it; tito renders it with the same environment's configuration in jinja2's",
        "`SandboxedEnvironment`, which allows those methods and nothing else more, on copies of its inputs",
        "(`env_server/rendering/jinja_engine.py`; noted in the table).",
        "",
        "**Templates that number calls.** llama.cpp's Kimi K2 Instruct and Thinking templates number every call of",
        "the conversation and write that number with each result, so a suffix depends on the calls before it. Rendering",
        "all of them at every Step grows with the conversation (the suffix alone: 0.47 ms after 8 calls, 3.2 ms after",
        "100, on one core of a 2-core machine; substituted, 0.2-0.3 ms after any number); tito",
        "renders the results exactly after no earlier call, and where the template wrote each output as it is, puts",
        "the outputs into a render after as many calls made once per shape with placeholder outputs; otherwise it",
        "renders the whole conversation. This assumes one thing: a template writes an output the same way whatever",
        "the number of calls before it. Registration checks it for outputs a template might write otherwise (blank,",
        "padded, quoted, markup) after 1 and 3 calls and renders whole at every Step if any differs; the golden",
        "check compares the suffixes with the template's render of real conversations; and the first substituted",
        "suffix of a tokenizer and every 64th after it is rendered whole as well and compared: a difference is",
        "logged as an error and ends substitution for that tokenizer (`env_server/rendering/context.py`,",
        "`tests/rendering/test_kimi.py`).",
        "",
        "**Parsing.** By default a call is read as the family's deployment parser (vLLM's) reads it where the",
        "format's grammar does not allow it: a Hermes `<tool_call>` left open at the end of the output, a",
        "Qwen3-Coder `</parameter>` missing before the next parameter, a parameter the tool does not declare where",
        "its schema allows more (`additionalProperties`, true unless it says false: tito's own tools say false),",
        "a `</parameter>` followed by such a parameter's tag inside a value that a later closing tag ends (read as",
        "the value's text);",
        "`null` written for a string parameter stays the string. Each repair is listed in the Step's `detail`.",
        "`parsing.strict: true` (server config, `TITO_PARSING__STRICT`) or `OpenSessionRequest.parsing_strict`",
        "answers them with the grammar's error messages instead. An XML value holding whole calls or parameters in",
        "the family's own markup reads whole where each closing tag closes a tag opened inside the value (as vLLM's",
        "qwen3_coder pairs them). The templates that write string values unescaped (LFM2.5's, OLMo 3's, Llama 4's",
        "pythonic) cannot write every value: a backslash is written raw, and Python, which reads their calls (as",
        "vLLM's parsers do, the way the models write them), reads `\\n` as a newline and a backslash ending a line as",
        "joining the lines. Registration names the values its probe found unwritable (the notes below), and each",
        "call the model makes with such a family is written back through the template and read again: one that",
        "does not come back as itself gets an error instead of running, so the conversation never shows another",
        "call than the one run (`env_server/rendering/carry.py`, `tests/rendering/test_carry.py`). A call whose",
        "values are all plain (letters, digits, inner spaces and `_.,:;+-*/=%!?@#$&^~()`: no quote, backslash,",
        "bracket or markup character) skips that write-back, which costs a render and a parse (0.2-0.3 ms);",
        "registration checks that the template carries a sample holding every plain character, or every call is",
        "written back.",
        "",
        f"{len(accepted)} accepted, {sum(r.verdict == 'refused' for r in rows)} refused, "
        f"{sum(r.verdict == 'skipped' for r in rows)} skipped.",
        "",
        "| template | source | verdict | family | wire format | stop tokens | cases | notes / reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r.template, template_source(r.template), r.verdict, r.family, r.wire, r.stops, cases_summary(r),
                 r.detail]
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    rows = [run_template(name) for name in all_templates()]
    DOC.write_text(markdown(rows), encoding="utf-8")
    print(json.dumps({r.template: r.verdict for r in rows}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
