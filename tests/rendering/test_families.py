"""Every chat template in the installed trl: refused at registration with a message, or exact on every case.

For each template of trl's ``chat_templates/`` folder (``*_training`` copies and vision-only ones
skipped, with the reason in the table): RegisterTokenizer's check either refuses it with a message
naming the failed step, or accepts it, and then every case (one call, parallel calls, unicode
output, special-token strings in the output, empty output, three rounds, a budget cut, a
non-canonical token split of the completion) is exact against the template's own render. A case
failing after acceptance (a "late failure") fails the test. The family × verdict table is printed
at the end of the run and must equal docs/families.md (TITO_UPDATE_DOCS=1 rewrites it).
"""

from __future__ import annotations

import os

import pytest

from .families_walk import DOC, MUST_ACCEPT, Row, all_templates, markdown, run_template

ROWS: dict[str, Row] = {}


@pytest.mark.parametrize("template", all_templates())
def test_template_refused_or_exact(template):
    row = run_template(template)
    ROWS[template] = row
    if template in MUST_ACCEPT:
        assert row.verdict == "accepted", f"{template} must be supported: {row.detail}"


def test_families_doc_is_generated_from_this_test():
    missing = [t for t in all_templates() if t not in ROWS]
    for template in missing:  # run alone (-k): walk what the parametrized test did not
        ROWS[template] = run_template(template)
    table = markdown([ROWS[t] for t in all_templates()])
    if os.environ.get("TITO_UPDATE_DOCS") == "1":
        DOC.write_text(table, encoding="utf-8")
    assert DOC.is_file() and DOC.read_text(encoding="utf-8") == table, (
        f"{DOC} is out of date: regenerate it with TITO_UPDATE_DOCS=1 (or python -m tests.rendering.families_walk)")
