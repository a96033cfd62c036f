"""String values a template cannot write: its writing of them reads back as another value.

Templates that write string values unescaped (Llama 4's pythonic ``"%s"``, LFM2.5's and OLMo 3's ``'...'``)
write a value holding a backslash as text that Python reads otherwise (``\\n`` is a newline, a backslash before a
newline joins the lines: ``ls \\`` then ``  -la`` becomes ``ls   -la``). A call run with such a value would show
in the conversation, as the template writes it, as another call than the one run. So registration names the
values the template cannot write (``FamilyRules.uncarried``, found by rendering ``HAZARDS``), and where it named
some, each call the model makes is written back through the template and read again: a call that does not come
back as itself gets an error instead of running (never a silent difference). A call whose values are all plain
strings (``PLAIN``: no quote, backslash, bracket or markup character, no space at either end) skips that write-back,
which costs a render and a parse: registration checks that the template carries ``PLAIN_SAMPLE``, holding every
plain character, and a template that does not gets every call written back.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from typing import Any

# Values the probe writes, one call each: whitespace at both ends, newlines, both quotes, backslashes (escapes and a
# shell line continuation).
HAZARDS = ("  spaces at both ends  ", "\nnewlines at both ends\n\n", 'a "double-quoted" word', "it's",
           "C:\\new\\table", "ls \\\n  -la")


# Characters no family quotes, escapes or marks up a call with; most code a model runs is made of them.
PLAIN = frozenset(string.ascii_letters + string.digits + " _.,:;+-*/=%!?@#$&^~()")
PLAIN_SAMPLE = "print(6*7) + x_1.y, z: a;b-c/d=e%f!g?h@i#j$k&l^m~n"
assert PLAIN.issuperset(PLAIN_SAMPLE) and PLAIN - set(string.ascii_letters + string.digits) <= set(PLAIN_SAMPLE)


def uncarried(reads_back: Callable[[str], bool]) -> tuple[str, ...]:
    """The probe values (the hazards and the plain sample) whose writing by the template does not read back as
    themselves."""
    return tuple(v for v in (*HAZARDS, PLAIN_SAMPLE) if not reads_back(v))


def is_plain(arguments: Any) -> bool:
    """Whether the arguments are all plain strings (PLAIN, no space at either end) under identifier names: what a
    template carrying PLAIN_SAMPLE writes back as itself. Other values (numbers, lists, objects) are written back,
    since a template may write them with its quote inside."""
    return isinstance(arguments, dict) and all(
        k.isidentifier() and k.isascii() and isinstance(v, str) and v == v.strip() and PLAIN.issuperset(v)
        for k, v in arguments.items())


def needs_write_back(uncarried_values: tuple[str, ...], arguments: str) -> bool:
    """Whether a call must be written back to know it is carried: the template cannot write some values, and the
    call's are not all plain (or the template cannot write even plain ones)."""
    if not uncarried_values:
        return False
    if PLAIN_SAMPLE in uncarried_values:
        return True
    try:
        return not is_plain(json.loads(arguments))
    except ValueError:
        return True


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
