import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may touch a model hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest

from .helpers import TEMPLATES, ctx_for


@pytest.fixture(params=TEMPLATES)
def ctx(request):
    return ctx_for(request.param)


def pytest_terminal_summary(terminalreporter):
    """The family × verdict table of test_families.py, when it ran."""
    from .families_walk import cases_summary
    from .test_families import ROWS

    if not ROWS:
        return
    terminalreporter.section("chat-template families (template × verdict)")
    for row in ROWS.values():
        cases = cases_summary(row, with_na=False)
        what = f"{row.family} ({row.wire})" if row.verdict == "accepted" else row.detail
        terminalreporter.write_line(f"{row.template:26} {row.verdict:9} {cases:18} {what[:150]}")
