import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may touch a model hub
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import pytest

from .helpers import TEMPLATES, ctx_for


@pytest.fixture(params=TEMPLATES)
def ctx(request):
    return ctx_for(request.param)
