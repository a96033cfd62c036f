"""Fixtures of the TRL tests: the offline tokenizer, the example module, a recording client.

TRL's experimental-API warnings (rollout_func, environment_factory) are silenced as the docs say.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from tests.trl.helpers import load_example, recording_client  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    return AutoTokenizer.from_pretrained(build_tokenizer_dir(template="qwen2_5"), padding_side="left")


@pytest.fixture(scope="module")
def example():
    return load_example()


@pytest.fixture(scope="module")
def client(server):
    """A TitoClient that records what the server answered (tito.client.RecordingClient)."""
    c = recording_client(server.address)
    c.wait_ready()
    yield c
    c.close()
