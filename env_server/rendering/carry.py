"""String values a template cannot write: its writing of them reads back as another value.

Templates that write string values unescaped (Llama 4's pythonic ``"%s"``, LFM2.5's and OLMo 3's ``'...'``)
write a value holding a backslash as text that Python reads otherwise (``\\n`` is a newline, a backslash before a
newline joins the lines: ``ls \\`` then ``  -la`` becomes ``ls   -la``). A call run with such a value would show
in the conversation, as the template writes it, as another call than the one run. So registration names the
values the template cannot write (``FamilyRules.uncarried``, found by rendering ``HAZARDS``), and where it named
some, each call the model makes is written back through the template and read again: a call that does not come
back as itself gets an error instead of running (never a silent difference).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# Values the probe writes, one call each: whitespace at both ends, newlines, both quotes, backslashes (escapes and a
# shell line continuation).
HAZARDS = ("  spaces at both ends  ", "\nnewlines at both ends\n\n", 'a "double-quoted" word', "it's",
           "C:\\new\\table", "ls \\\n  -la")


def uncarried(reads_back: Callable[[str], bool]) -> tuple[str, ...]:
    """The hazard values whose writing by the template does not read back as themselves."""
    return tuple(v for v in HAZARDS if not reads_back(v))


def note(values: tuple[str, ...]) -> str:
    return (f"the template cannot write every string value ({', '.join(repr(v) for v in values)} read back as "
            "other values); a call holding a value it cannot write gets an error")


def error(name: str) -> str:
    return (f"this model's chat template cannot write this call to {name} as it was read (its writing of the call, "
            "string values unescaped, reads back as another call: a backslash, its quote or its own markers in a "
            "value do that), so the conversation would show another call than the one run; this call was not run. "
            "Write the value without them, or pass the text another way")


def writes_back(render: Callable[[str, Any], str], read: Callable[[str], list], name: str, arguments: str) -> bool:
    """Whether the call, written by the template (``render``) and read again (``read``: [(name, arguments)]), has
    each of its string values back. Other values are the schema's to type (``"%s"`` writes None as the text
    None), not the template's to carry."""
    try:
        args = json.loads(arguments)
        (got_name, got), = read(render(name, args))
        return got_name == name and all(got.get(k) == v for k, v in args.items() if isinstance(v, str))
    except Exception:  # a template that cannot render the call, or whose writing reads as no call or several
        return False
