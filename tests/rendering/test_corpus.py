"""The corpus of realistic outputs (corpus.py) through every covered family's registered context.

For each (family, case): the template writes the calls, the case edits the text as a model writes
it, and the parsed calls are exactly what must run, in order, with their typed arguments; a call
that does not read is not run and its message says why.
"""

from __future__ import annotations

import pytest

from .corpus import CASES, FAMILIES, applies, check
from .helpers import ctx_for


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("template", FAMILIES)
def test_corpus(template, case):
    ctx = ctx_for(template)
    why = applies(case, ctx)
    if why:
        pytest.skip(why)
    check(case, ctx)
