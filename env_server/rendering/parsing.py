"""Tool-call parsing: what every wire format shares, and the registry of wire formats.

Why our own parsers and not ``transformers``' ``parse_response`` at run time: its response templates
decode the arguments into Python objects, so the JSON text the model wrote is lost (the trainer's
contract is "arguments: the JSON text as written"); one malformed call makes the whole message
fail, while each malformed call must get its own tool message saying what was wrong; it strips
whitespace from XML/GLM values (code loses its trailing newline) and ends a value at the first
closing tag, even one inside the value; it covers nothing for DeepSeek, Kimi, MiniMax, Mistral or
Seed-OSS. vLLM's and SGLang's parsers are regular expressions per family with the same first-closer
rule, and llama.cpp's PEG parsers read a value ``until`` its closer; none of them can tell a value
that holds a call from a call. So the boundaries here come from each family's grammar:
- JSON formats (``parse_json``, ``parse_named``): ``json``'s own decoder reads each call (or its arguments)
  from its marker, so the JSON decides where it ends;
- XML formats (``parse_xml``): a value ends only at a closing tag the grammar allows there, checked
  against the tool's declared parameters and the rest of the completion (backtracking);
- pythonic formats (``parse_pythonic``): Python's own parser (``ast``) reads the call list.
transformers' ``parse_response`` is right on well-formed Hermes, Llama 3 and Gemma 4 output, so the
tests use it as an oracle there; its JSON-dialect reader is reused for Gemma 4 (``parse_gemma4``).

A wire format is a configuration of one of these readers (a row of a table), not a parser per
family. A parser takes the completion text without its stop token (harmony keeps it: ``<|call|>``
delimits a call) and with reasoning already split off, plus the session's tools (to type values)
and whether parsing is strict, and returns ``(content, reasoning, calls)``; a call it cannot read is
a call with ``error``, which the model gets as its tool message.

Not strict (the default), a parser reads what the family's deployment parser (vLLM's) reads although
the family's grammar does not allow it, and says so in the call's ``repairs`` (the Step's detail
records them): a Hermes ``<tool_call>`` left open at the end of the output, a Qwen3-Coder
``</parameter>`` missing before the next parameter, a parameter the tool does not declare where its
schema allows more. Such a reading is only tried when the text has no reading by the grammar, so a
well-formed call is never read differently. Strict, these get the grammar's error messages.
"""

from __future__ import annotations

from . import parse_gemma4, parse_harmony, parse_json, parse_named, parse_pythonic, parse_xml
from .calls import WireFormat


def formats() -> dict[str, WireFormat]:
    """Every wire format, in the order registration tries them: marked formats first, bare ones last."""
    every = (parse_harmony.FORMATS + parse_gemma4.FORMATS + parse_named.FORMATS + parse_json.FORMATS
             + parse_xml.FORMATS + parse_pythonic.FORMATS)
    return {f.name: f for f in sorted(every, key=lambda f: f.bare)}
