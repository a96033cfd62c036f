"""Check a tokenizer directory the way RegisterTokenizer does, and show what the server would do with it.

    python -m env_server.check_tokenizer DIR [--chat-template-kwargs '{"enable_thinking": false}']

Prints the family detected, the tool-call parser (wire format), the stop tokens and their ids,
the call turn of a sample tool call and its suffix (the tool-result turn plus the next assistant
header) as text and ids, what would run for a few outputs the way models write them (prose before
a call, two calls, a value holding the family's own call markup), and the verdict: ACCEPTED (exit
status 0) or REFUSED with the reason and the step of the registration check that failed (exit
status 1). Nothing leaves this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from jinja2.exceptions import TemplateError

from env_server.rendering import (
    InvalidTokenizerFilesError,
    RenderingContext,
    TokenizerRegistry,
    UnsupportedTemplateError,
)
from env_server.rendering import messages as msgs
from env_server.rendering.probe import PROBE_TOOLS
from tito.types import Message

_SAMPLE = ("run_python", {"code": "print(6 * 7)"})


def _show(label: str, ctx: RenderingContext, ids: list[int]) -> None:
    print(f"{label} text: {ctx.decode(ids)!r}")
    print(f"{label} ids:  {ids}")


def report(ctx: RenderingContext) -> None:
    rules = ctx.rules
    print(f"family:        {rules.name}")
    print(f"parser:        {rules.wire} (wire format)")
    print("stop tokens:   " + ", ".join(f"{s} = {i}" for s, i in zip(rules.stop_tokens, ctx.stop_token_ids)))
    print(f"call turns end with {rules.boundary}" + (" (it also opens the tool results)" if rules.opens_results else "")
          + (" (the template writes it only with the results: overlap rule)" if rules.overlap else ""))
    if rules.max_calls_per_turn:
        print(f"calls per turn: at most {rules.max_calls_per_turn}")
    for note in rules.notes:
        print(f"note:          {note}")
    style = rules.style
    conv = msgs.head(style, {"role": "user", "content": "What is 6 times 7?"})
    turn = msgs.assistant(style, [(style.call_id(1, 0, _SAMPLE[0]), *_SAMPLE)],
                          msgs.SYNTHETIC_REASONING if style.reasoning_field else None)
    completion = ctx.encode(ctx.completion_text(conv, turn, PROBE_TOOLS))
    _show("sample call turn", ctx, completion)
    parsed = ctx.parse_completion(completion, seq=1, tools=PROBE_TOOLS)
    for c in parsed.tool_calls:
        print(f"parsed call:   {c.name}({c.arguments})" + (f" error: {c.error}" if c.error else ""))
    suffix = ctx.render_suffix(parsed.tool_calls, [Message.tool_result(c, "42\n") for c in parsed.tool_calls], None)
    _show("suffix", ctx, suffix.ids)
    for quirk in ctx.quirks:
        print(f"quirk:         {quirk}")
    for label, text in realistic_outputs(ctx):
        if text.startswith("("):
            print(f"\n{label}: {text}")
            continue
        ids = ctx.encode(text)  # control-token strings inside a value are text, as a model may write them
        print(f"\n{label}: {ctx.decode(ids)!r}")
        for c in ctx.parse_completion(ids, seq=2, tools=PROBE_TOOLS).tool_calls:
            print(f"  would run:   {c.name}({c.arguments})  id {c.id}" if not c.error else f"  not run:     {c.error}")


def realistic_outputs(ctx: RenderingContext) -> list[tuple[str, str]]:
    """(label, completion text) of a few outputs as models write them, each written by the template itself:
    prose before a call, two calls, and code whose text holds the family's own writing of a call."""
    style = ctx.rules.style
    conv = msgs.head(style, {"role": "user", "content": "What is 6 times 7?"})
    reasoning = msgs.SYNTHETIC_REASONING if style.reasoning_field else None

    def written(calls, content: str = "") -> str:
        turn = msgs.assistant(style, [(style.call_id(2, i, n), n, a) for i, (n, a) in enumerate(calls)], reasoning,
                              content)
        try:
            return ctx.completion_text(conv, turn, PROBE_TOOLS)
        except TemplateError as e:  # Llama 3.1's raises on a second call
            return f"(the template does not render this: {e})"

    markup = written([_SAMPLE])
    return [
        ("prose, then a call", written([_SAMPLE], content="Let me compute that.")),
        ("two calls", written([_SAMPLE, ("lookup", {"word": "naïve"})])),
        ("a value holding the family's own call markup",
         written([("run_python", {"code": f"doc = {markup!r}\nprint(len(doc))"})])),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m env_server.check_tokenizer", description=__doc__.split("\n\n")[0])
    ap.add_argument("directory", help="a tokenizer folder (tokenizer.json, tokenizer_config.json, ...) or a fetched "
                    "model's name (python -m tito_assets.fetch_model --list)")
    ap.add_argument("--chat-template-kwargs", default="{}", help="JSON object passed to the chat template")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        kwargs = json.loads(args.chat_template_kwargs)
    except json.JSONDecodeError as e:
        ap.error(f"--chat-template-kwargs is not JSON: {e}")
    if not isinstance(kwargs, dict):
        ap.error("--chat-template-kwargs must be a JSON object")
    from tito.tokenizer_files import tokenizer_files

    from tito_assets.models import ModelUnavailableError, resolve_model

    try:
        files = tokenizer_files(Path(resolve_model(args.directory)))
        ctx = TokenizerRegistry(max_entries=1).register(files, kwargs)
    except (InvalidTokenizerFilesError, UnsupportedTemplateError, ModelUnavailableError, OSError, ValueError) as e:
        print(f"verdict: REFUSED\nreason:  {e}")
        return 1
    report(ctx)
    print("verdict: ACCEPTED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
