"""Shared fixtures of the trainer tests that talk to a real env server."""

from __future__ import annotations

import pytest

from tests.harness import docker_available, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real env server subprocess (one per test module), real containers."""
    why = docker_available()
    if why:
        pytest.skip(why)
    srv = start_server(tmp_path_factory.mktemp("trainer"), env={"TITO_POOL__TARGET_SIZE": "3"})
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def tok():
    """The offline Qwen tokenizer (qwen2_5 template): its files and a `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    from tito.fingerprint import read_tokenizer_files
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    files = read_tokenizer_files(build_tokenizer_dir(template="qwen2_5"))
    return files, Tokenizer.from_str(files["tokenizer.json"].decode())
