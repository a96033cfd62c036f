"""The registration probe: what a template needs and does, found by rendering it (never by its name).

Steps, each named in a refusal:
1. message shape: an assistant call turn and its result must render (tool name, arguments and
   output all present); tried with arguments as a mapping, then as JSON text (a JSON-text template
   raises on a mapping or prints its Python repr), content "" then None, no system message then
   one, tito's call ids, then 9-character alphanumeric ones, then Kimi's functions.NAME:IDX (a template
   that writes the call's id and not its name: any other id it writes before the arguments is passed over).
2. parallel calls: two calls in one message must render both, else one call per turn.
3. reasoning: the field whose text the template writes in a call turn, and the tags around it.
4. stop tokens, from renders: the token that ends a plain answer (or, if the template never
   closes one, the next role token), and the boundary that ends a call turn: the last added token
   of the call turn when the template closes turns (also where it writes its generation prompt after
   every conversation, ToolACE, or renders the call turn otherwise once results follow, Nemotron
   Nano 2: then the suffix follows the token as past turns render it; or drops a last call turn as a
   prefill, Nemotron JSON: then the turn is read where results follow, ended by the answer's end
   token); otherwise the token the tool turn opens with, which the model emits as its stop (overlap:
   GLM's <|observation|>), or the call turn's own last token (Apertus: results are text inside the assistant turn). The synthetic call
   turn carries reasoning only if the template re-renders it otherwise (Qwen3 drops empty thinking),
   and tools only if the conversation renders otherwise without them (MUSE Glimmer).
5. wire format: a turn of calls with a number-looking string, an integer and code with quotes and
   newlines is rendered and must parse back exactly with one of the wire formats.
6. values: string values with whitespace at both ends, quotes and backslashes are rendered one call each; those
   that read back as other values are named in the notes, and calls holding such values get an error (carry.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

from . import carry
from .errors import UnsupportedTemplateError
from .families import FamilyRules, MessageStyle
from .messages import assistant, synthetic_head, synthetic_tools, tool
from .calls import split_reasoning
from .parsing import formats
from .template import ChatTemplate, lcp
from .values import tool_index

CODE = 'import json\nd = {"k": [1, 2], \'q\': "it\'s"}\nprint(json.dumps(d), f(")"))  # done\n'
PROBE_TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
    for name, desc, props in (
        ("run_python", "Run Python code.", {"code": {"type": "string"}}),
        ("lookup", "Look a word up.", {"word": {"type": "string"}}),
        ("get_weather", "Weather for a place.",
         {"city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"}}),
    )
]
PROBE_CALLS = [("get_weather", {"city": "Paris", "zip": "75001", "days": 3}), ("run_python", {"code": CODE})]
_ARG, _OUT, _ANSWER, _THOUGHT = "zqx_argument", "zqx_output", "zqx answer", "zqx reasoning"
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


@dataclass(frozen=True)
class Boundary:
    """How a call turn ends (step 4)."""

    style: MessageStyle
    token: str  # the boundary: the token the model stops on after its calls
    overlap: bool  # the template writes it only with the results, as their first token (GLM)
    opens_results: bool
    rerenders: bool = False  # the call turn renders otherwise once results follow (FamilyRules.rerenders_call_turn)


def refuse(step: str, what: str, todo: str) -> UnsupportedTemplateError:
    return UnsupportedTemplateError(f"registration check, step '{step}': {what}. {todo}")


_NO_TOOLS = ("tito needs a chat template with tool calling (assistant tool_calls and role 'tool' messages); "
             "upload the model's tool-calling template, or send parsed tool_calls without a tokenizer")


class Probe:
    def __init__(self, t: ChatTemplate) -> None:
        self.t = t

    def render(self, messages: list[dict], generation_prompt: bool = False, tools: list | None = None) -> str:
        return self.t.render(messages, tools, generation_prompt)

    def turn(self, style: MessageStyle, calls, reasoning: str | None = None, seq: int = 0) -> dict:
        return assistant(style, [(style.call_id(seq, i, n), n, a) for i, (n, a) in enumerate(calls)], reasoning)

    def results(self, style: MessageStyle, calls, outputs, seq: int = 0) -> list[dict]:
        return [tool(n, style.call_id(seq, i, n), o) for i, ((n, _), o) in enumerate(zip(calls, outputs))]

    # ---------------------------------------------------------------- 1. message shape

    def message_shape(self) -> MessageStyle:
        calls = [("lookup", {"word": _ARG})]
        problems: list[str] = []
        for system in (False, True):
            for ids in ("tito", "alnum9", "kimi"):
                for json_args in (False, True):
                    for content_none in (False, True):
                        style = MessageStyle(json_args=json_args, content_none=content_none, system=system, ids=ids)
                        why = self._shape_problem(style, calls)
                        if why is None:
                            return style
                        problems.append(why)
        raise refuse("message shape", f"the template does not render an assistant tool call and its result "
                     f"({problems[0]})", _NO_TOOLS)

    def _shape_problem(self, style: MessageStyle, calls) -> str | None:
        try:
            text = self.render(synthetic_head(style) + [self.turn(style, calls)] + self.results(style, calls, [_OUT]),
                               True)
        except Exception as e:  # jinja raises anything: TypeError, TemplateError, ...
            return f"it raised {type(e).__name__}: {str(e)[:200]}"
        missing = [s for s in ("lookup", _ARG, _OUT) if s not in text]
        if missing:
            return f"{', '.join(map(repr, missing))} missing from its render"
        if not style.json_args and "{'word': " in text:
            return "it printed the arguments' Python repr (it wants JSON text)"
        if style.json_args and '\\"word\\"' in text:
            return "it encoded the JSON-text arguments a second time"
        before_args = text[:text.find(_ARG)]
        if style.ids != "kimi" and style.call_id(0, 0, "lookup") in before_args and "lookup" not in before_args:
            # It writes the id where the name belongs (llama.cpp's Kimi K2 Thinking before its current copy): the
            # name must reach the model through the id, in the family's form (kimi ids), tried after these.
            return "it writes the call's id, not its name, before the arguments"
        return None

    # ---------------------------------------------------------------- 2. parallel calls

    def max_calls(self, style: MessageStyle) -> int | None:
        calls = [("run_python", {"code": _ARG + "1"}), ("lookup", {"word": _ARG + "2"})]
        try:
            text = self.render(synthetic_head(style) + [self.turn(style, calls)]
                               + self.results(style, calls, ["a", "b"]), True)
        except Exception:
            return 1  # Llama 3.1: "This model only supports single tool-calls at once!"
        return None if _ARG + "2" in text else 1  # gpt-oss renders tool_calls[0] only

    # ---------------------------------------------------------------- 3. reasoning

    def reasoning(self, style: MessageStyle) -> MessageStyle:
        calls = [("lookup", {"word": _ARG})]
        for name in _REASONING_FIELDS:
            candidate = dataclasses.replace(style, reasoning_field=name)
            try:
                text = self.render(synthetic_head(candidate) + [self.turn(candidate, calls, _THOUGHT)])
            except Exception:
                continue
            if _THOUGHT in text:
                return candidate
        return style

    def reasoning_tags(self, style: MessageStyle) -> tuple[tuple[str, str] | None, bool]:
        """((open, close) around reasoning in a completion, whether the generation prompt opens it)."""
        if not style.reasoning_field:
            return None, False
        tools = synthetic_tools(style)
        h = self.render(synthetic_head(style), True, tools)
        text = self.render(synthetic_head(style) + [self.turn(style, [("lookup", {"word": _ARG})], _THOUGHT)], False,
                           tools)
        at, start = text.find(_THOUGHT), self.t.turn_start(h, text)
        after = self.t.added_tokens_in(text, at + len(_THOUGHT))
        open_tag = text[start:at].strip()  # what the model writes before its reasoning (Gemma: '<|channel>thought')
        prefilled = not open_tag
        if prefilled:  # the generation prompt opened the block (Qwen3.5: '<think>\n'): its last token
            before = self.t.added_tokens_in(text, 0, at)
            open_tag = before[-1][0] if before else ""
        if not open_tag or not after:
            return None, False
        return (open_tag, text[at + len(_THOUGHT):after[0][1] + len(after[0][0])].strip()), prefilled

    # ---------------------------------------------------------------- 4. stops and the boundary

    def answer_end(self, style: MessageStyle) -> tuple[str | None, str | None]:
        """(the token after a final answer, the token after an answer followed by a user turn)."""
        out = []
        for extra in ([], [{"role": "user", "content": "next"}]):
            text = self.render(synthetic_head(style) + [{"role": "assistant", "content": _ANSWER}] + extra)
            toks = self.t.added_tokens_in(text, text.rfind(_ANSWER) + len(_ANSWER))
            out.append(toks[0][0] if toks else None)
        return out[0], out[1]

    def boundary(self, style: MessageStyle, plain_end: str | None) -> Boundary:
        """The token that ends a call turn, tried with the synthetic turn plain, then with reasoning (Qwen3 drops an
        empty thinking block), each without tools, then opening with a system message, then with one tool (MUSE
        Glimmer writes its system turn only with tools, a system message or a generation prompt); the first of the
        rules below that fits wins."""
        calls = [("lookup", {"word": _ARG})]
        problems: list[str] = []
        for with_reasoning in ([False, True] if style.reasoning_field else [False]):
            for with_system, with_tools in ((False, False), (True, False), (False, True)):
                if with_system and style.system:
                    continue  # the same conversation as the first
                st = dataclasses.replace(style, reasoning_in_synthetic=with_reasoning, tools_in_synthetic=with_tools,
                                         system_in_synthetic=with_system)
                reasoning, tools = _THOUGHT if with_reasoning else None, synthetic_tools(st)
                h = self.render(synthetic_head(st), True, tools)
                a = self.render(synthetic_head(st) + [self.turn(st, calls, reasoning)], False, tools)
                b = self.render(synthetic_head(st) + [self.turn(st, calls, reasoning)]
                                + self.results(st, calls, [_OUT]), True, tools)
                start = self.t.turn_start(h, a)
                if lcp(a, b) < start:  # the conversation before the call turn renders otherwise
                    problems.append(f"adding the tool results changes the conversation before the call turn "
                                    f"({a[lcp(a, b):lcp(a, b) + 40]!r} vs {b[lcp(a, b):lcp(a, b) + 40]!r})")
                    continue
                rule = (self._open_turn(a, b) if plain_end is None and lcp(a, b) == len(a) else
                        self._closed_turn(a, b, start) or self._prompt_always_written(st, a, b, start, tools)
                        or self._rerendered_turn(a, b, start) or self._prefilled_turn(a, b, start, plain_end))
                if isinstance(rule, Boundary):
                    return dataclasses.replace(rule, style=st)
                problems.append(rule or f"adding the tool results re-renders the call turn: it reads "
                                        f"{a[lcp(a, b):lcp(a, b) + 60]!r} alone, {b[lcp(a, b):lcp(a, b) + 60]!r} "
                                        "followed by the results")
        raise refuse("stop tokens", f"cannot find the token that ends an assistant turn that calls tools "
                     f"({problems[0]})", "The template must end a call turn with a token, in the same place before "
                     "and after its tool results")

    def _open_turn(self, a: str, b: str) -> Boundary | str:
        """The template never closes a call turn; the results follow it. Either they open with a token, which the
        model emits as its stop (overlap: GLM's <|observation|>), or the call turn ends with one of its own (Apertus'
        <|tools_suffix|>: the results are text inside the assistant turn, after the calls)."""
        toks = self.t.added_tokens_in(b, len(a), len(a) + 64)
        if toks and toks[0][1] == len(a):
            return Boundary(MessageStyle(), toks[0][0], overlap=True, opens_results=True)
        own = self.t.added_tokens_in(a, max(0, len(a) - 64))
        if own and own[-1][1] + len(own[-1][0]) == len(a):
            return Boundary(MessageStyle(), own[-1][0], overlap=False, opens_results=False)
        return (f"the call turn is not closed and the tool turn starts with text {b[len(a):len(a) + 40]!r}, "
                "so nothing tells the model's turn has ended")

    def _closed_turn(self, a: str, b: str, start: int) -> Boundary | None:
        """The call turn renders the same before and after its results, through its last token."""
        p = lcp(a, b)
        toks = self.t.added_tokens_in(a, start, p)
        if not toks or a[p:].strip() or a[toks[-1][1] + len(toks[-1][0]):p].strip():
            return None
        return self._after(toks[-1], b)

    def _prompt_always_written(self, style: MessageStyle, a: str, b: str, start: int, tools) -> Boundary | None:
        """The template writes its generation prompt after every conversation, asked for or not (ToolACE,
        Phi-4-mini): the call turn ends at its first token after which the render is only that prompt."""
        h = self.render(synthetic_head(style), True, tools)
        if self.render(synthetic_head(style), False, tools) != h:
            return None
        for tok in self.t.added_tokens_in(a, start, lcp(a, b)):
            if h.endswith(a[tok[1] + len(tok[0]):]):
                return self._after(tok, b)
        return None

    def _rerendered_turn(self, a: str, b: str, start: int) -> Boundary | None:
        """The call turn renders otherwise once results follow (Nemotron Nano 2 writes '\n' before its end token
        in past turns, not in the last one), but ends with the same token: the model stops on it as the template
        writes the last turn, and the results follow it as the template writes past turns."""
        toks = self.t.added_tokens_in(a, start)
        out = b.find(_OUT, start)
        if not toks or a[toks[-1][1] + len(toks[-1][0]):].strip() or out < 0:
            return None
        token = toks[-1][0]
        at = self.t.find_token(b, token, last=True, start=start, end=out)
        if at < 0:
            return None
        return dataclasses.replace(self._after((token, at), b), rerenders=True)

    def _prefilled_turn(self, a: str, b: str, start: int, plain_end: str | None) -> Boundary | None:
        """The template renders a last assistant message as a prefill and drops its calls (vLLM's Nemotron JSON): the
        call turn is read where results follow it, ended by the token that ends an answer, first after the call."""
        arg = b.find(_ARG, start)
        if plain_end is None or _ARG in a[start:] or arg < 0 or (out := b.find(_OUT, arg)) < 0:
            return None
        at = self.t.find_token(b, plain_end, start=arg, end=out)
        if at < 0:
            return None
        return dataclasses.replace(self._after((plain_end, at), b), rerenders=True)

    def _after(self, tok: tuple[str, int], b: str) -> Boundary:
        end = tok[1] + len(tok[0])
        following = self.t.added_tokens_in(b, end, end + 64)
        opens = not following or bool(b[end:following[0][1]].strip())  # the results start with text
        return Boundary(MessageStyle(), tok[0], overlap=False, opens_results=opens)

    def stop_tokens(self, boundary: str, answer_end: str) -> tuple[str, ...]:
        stops = [boundary, answer_end]
        eos = self.t.tokenizer.eos_token
        if isinstance(eos, str) and self.t.token_id(eos) is not None:
            stops.append(eos)
        for token in stops[:2]:
            if self.t.token_id(token) is None:
                raise refuse("stop tokens", f"the template ends turns with {token!r}, which is not one token of the "
                             "uploaded vocabulary", "Upload the tokenizer that belongs to this template")
        return tuple(dict.fromkeys(stops))

    # ---------------------------------------------------------------- 5. wire format

    def completion_text(self, style: MessageStyle, calls, reasoning: str | None, boundary: str,
                        overlap: bool) -> str:
        """The call turn as the model generates it: from where it leaves the generation prompt through the boundary."""
        tools = synthetic_tools(style)
        h = self.render(synthetic_head(style), True, tools)
        a = self.render(synthetic_head(style) + [self.turn(style, calls, reasoning)], False, tools)
        start = self.t.turn_start(h, a)
        if not a[start:].strip():  # the template drops a last call turn (a prefill): read it where results follow
            a = self.render(synthetic_head(style) + [self.turn(style, calls, reasoning)]
                            + self.results(style, calls, [_OUT] * len(calls)), True, tools)
            start = self.t.turn_start(h, a)
            return a[start:self.t.find_token(a, boundary, start=start) + len(boundary)]
        if overlap:
            return a[start:] + boundary
        return a[start:a.rfind(boundary) + len(boundary)]

    def uncarried(self, style: MessageStyle, boundary: str, overlap: bool, tags, wire: str, keep: bool
                  ) -> tuple[str, ...]:
        """6. values: the string values (carry.HAZARDS) whose writing by the template reads back as another value."""
        index = tool_index(PROBE_TOOLS)
        reasoning = _THOUGHT if style.reasoning_in_synthetic else None

        def reads_back(value: str) -> bool:
            calls = [("lookup", {"word": value})]
            try:
                text = self.completion_text(style, calls, reasoning, boundary, overlap)
            except Exception:
                return False
            return _parses_back(formats()[wire], text, calls, boundary, tags, index, keep)

        return carry.uncarried(reads_back)

    def wire_format(self, style: MessageStyle, boundary: str, overlap: bool, tags, max_calls) -> tuple[str, bool]:
        """(the wire format, whether the parser reads the boundary with the calls: it is their closing marker)."""
        groups = [PROBE_CALLS] if max_calls is None else [[c] for c in PROBE_CALLS]
        index = tool_index(PROBE_TOOLS)
        reasoning = _THOUGHT if style.reasoning_in_synthetic else None
        texts = [self.completion_text(style, calls, reasoning, boundary, overlap) for calls in groups]
        if max_calls is None and texts[0].count(boundary) != 1:
            raise refuse("stop tokens", f"the template closes no turn of tool calls: {boundary!r}, the last token it "
                         f"writes in a call turn, ends each call ({texts[0][-160:]!r}), so the model's stop token "
                         "after its calls is unknown", "Use a template that ends a call turn with an end-of-turn token")
        for keep in (False, True):
            for wire in formats().values():
                if keep and (wire.delimited_by_stop or overlap):
                    continue
                if all(_parses_back(wire, text, calls, boundary, tags, index, keep)
                       for text, calls in zip(texts, groups)):
                    return wire.name, keep
        raise refuse("wire format", f"{_why_unreadable(texts[0])}the template writes tool calls as {texts[0][:300]!r}, "
                     f"which none of the wire formats ({', '.join(formats())}) parses back exactly",
                     "Use a template that writes calls in one of these formats")


def _why_unreadable(text: str) -> str:
    """What in the template's writing of the probe calls makes them unreadable, where it is one of the known cases."""
    if any(f"{sep}Paris" in text for sep in ("=", ": ", ":")):
        return ("it writes string values without quotes (city=Paris), so a value that holds ', ' or ')' (code does) "
                "cannot be told from the call's own syntax; ")
    if '"Paris"zip=' in text:
        return 'it writes no separator between arguments (city="Paris"zip=...); '
    return ""


def _parses_back(wire, text: str, calls, boundary: str, tags, index, keep_boundary: bool = False) -> bool:
    body = text if wire.delimited_by_stop or keep_boundary else text.removesuffix(boundary)
    if tags[0] and not wire.delimited_by_stop:
        _, body = split_reasoning(body, *tags[0], prefilled=tags[1])
    try:
        _, _, raw = wire.parse(body, index)
        got = [(c.name, json.loads(c.arguments) if not c.error else c.error) for c in raw]
    except Exception:
        return False
    return got == [(n, a) for n, a in calls]


def decide(t: ChatTemplate) -> FamilyRules:
    """The family rules of a template, or UnsupportedTemplateError naming the failed step."""
    p = Probe(t)
    style = p.reasoning(p.message_shape())
    max_calls = p.max_calls(style)
    plain_end, plain_next = p.answer_end(style)
    found = p.boundary(style, plain_end)
    style, boundary, overlap = found.style, found.token, found.overlap
    answer_end = plain_end or plain_next
    if answer_end is None:
        raise refuse("stop tokens", "the template writes no token after an assistant answer",
                     "Use a template that ends assistant turns with a token")
    stops = p.stop_tokens(boundary, answer_end)
    tags, prefilled = p.reasoning_tags(style)
    wire, keeps_boundary = p.wire_format(style, boundary, overlap, (tags, prefilled), max_calls)
    label = formats()[wire].family
    if wire == "hermes" and "<|im_start|>" not in t.source:
        label = "hermes"
    notes = []
    if style.json_args:
        notes.append("the template reads tool-call arguments as JSON text")
    if max_calls:
        notes.append(f"the template renders {max_calls} call per assistant message; further calls get an error")
    uncarried = p.uncarried(style, boundary, overlap, (tags, prefilled), wire, keeps_boundary)
    if uncarried:
        notes.append(carry.note(uncarried))
    return FamilyRules(
        name=label, wire=wire, stop_tokens=stops, boundary=boundary, answer_end=answer_end, overlap=overlap,
        calls_need_boundary=boundary != answer_end, opens_results=found.opens_results, reasoning_tags=tags,
        rerenders_call_turn=found.rerenders, boundary_closes_calls=keeps_boundary,
        reasoning_prefilled=prefilled,
        max_calls_per_turn=max_calls, uncarried=uncarried, style=style, notes=tuple(notes),
    )

