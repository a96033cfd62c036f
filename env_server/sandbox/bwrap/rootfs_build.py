"""Builds the bwrap backend's root filesystems, without Docker, from the recipes of the sandbox images.

    python -m env_server.sandbox.bwrap.rootfs_build base                 debootstrap (root), or --from-tar FILE
    python -m env_server.sandbox.bwrap.rootfs_build sandbox              tito-sandbox-python:latest
    python -m env_server.sandbox.bwrap.rootfs_build scientific --site D  tito-sandbox-scientific:latest
    python -m env_server.sandbox.bwrap.rootfs_build task CONTEXT --image tito-task-NAME:TAG
    python -m env_server.sandbox.bwrap.rootfs_build export IMAGE         a built Docker image, exactly
    python -m env_server.sandbox.bwrap.rootfs_build check IMAGE ...      load them as the server would
    python -m env_server.sandbox.bwrap.rootfs_build python-version IMAGE for pip --python-version

Each step does what the image's Dockerfile does, on a directory: `sandbox` is sandbox_images/python/Dockerfile
(the user 1000 `sandbox`, /workspace, the runtime at /opt/tito, the ENV and CMD read from that file), on the
debootstrap base; `scientific` adds the packages pip installed for the rootfs's Python at /opt/tito/scientific
and their .pth; `task` adds a prepared task context (repo/ without .git, site/) at /opt/tito-task. An image
built FROM another starts as hard links to its tree (nothing is copied twice; the builder only ever adds files
or replaces them with new ones, so the parent is never changed through a link). A build goes to a temporary
folder and replaces the old one at the end; a build whose recipe digest is already there is skipped (--force
rebuilds). Python inside a rootfs (byte-compiling the runtime, checking imports) runs in bwrap.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from . import rootfs
from .rootfs import METADATA, TREE, RootfsImage
from .rootfs_tree import (BASE_ENV, BuildError, add_pth, add_tree, clone_tree, compile_runtime, dockerfile_config,
                          harden, listing_digest, log, run_in, tree_digest, tree_digest_file, write_new)

__all__ = ["BASE_ENV", "BuildError", "Builder", "dockerfile_config", "harden", "main"]

BUILDER_VERSION = "1"
SANDBOX_IMAGE = "tito-sandbox-python:latest"
SCIENTIFIC_IMAGE = "tito-sandbox-scientific:latest"
SLIMMED = ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "usr/share/doc", "usr/share/man",
           "usr/share/info")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join((BUILDER_VERSION, *parts)).encode()).hexdigest()[:16]


class Builder:
    def __init__(self, rootfs_dir: Path, force: bool = False) -> None:
        self.rootfs_dir = rootfs_dir
        self.force = force

    def _meta(self, name: str) -> dict[str, object] | None:
        try:
            return json.loads((rootfs.image_dir(self.rootfs_dir, name) / METADATA).read_text())
        except (OSError, ValueError):
            return None

    def _current(self, name: str, recipe: str) -> bool:
        meta = self._meta(name)
        if self.force or meta is None or meta.get("recipe") != recipe:
            return False
        log(f"{name}: up to date ({rootfs.image_dir(self.rootfs_dir, name)}, built {meta.get('built_at')})")
        self._harden(name, rootfs.image_dir(self.rootfs_dir, name) / TREE)  # one built before trees were hardened
        return True

    @staticmethod
    def _harden(name: str, tree: Path) -> None:
        changed = harden(tree)
        if changed:
            shown = ", ".join("/" + c.lstrip("./") for c in changed[:6]) + (" ..." if len(changed) > 6 else "")
            log(f"{name}: write permission for group and others taken off {len(changed)} paths ({shown})")

    def _parent(self, name: str) -> tuple[Path, dict[str, object]]:
        meta = self._meta(name)
        if meta is None:
            raise BuildError(f"{name} has no root filesystem in {self.rootfs_dir}: build it first")
        return rootfs.image_dir(self.rootfs_dir, name) / TREE, meta

    def _install(self, name: str, staging: Path, image: RootfsImage) -> Path:
        """Writes the metadata and puts the staged build, hardened, in place of the old one."""
        self._harden(name, staging / TREE)
        (staging / METADATA).write_text(json.dumps(image.metadata(), indent=2) + "\n")
        final = rootfs.image_dir(self.rootfs_dir, name)
        old = None
        if final.exists():
            old = final.with_name(f"{final.name}.old-{os.getpid()}")
            os.rename(final, old)
        os.rename(staging, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        os.chmod(final, 0o755)
        return final

    def _staging(self, name: str) -> Path:
        self.rootfs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.rootfs_dir, 0o755)
        return Path(tempfile.mkdtemp(prefix=f"{rootfs.image_key(name)}.building-", dir=self.rootfs_dir))

    def _image(self, name: str, recipe: str, source: str, tree: Path, config: dict[str, object]) -> RootfsImage:
        has_runtime = (tree / "opt/tito/repl_server.py").exists()
        return RootfsImage(image=name, path=tree, env=dict(config.get("env") or {}),  # type: ignore[call-overload]
                           cmd=tuple(config.get("cmd") or ()), workdir=str(config.get("workdir") or "/workspace"),
                           runtime_digest=rootfs.runtime_digest() if has_runtime else "", recipe=recipe, source=source,
                           built_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))

    def _build(self, name: str, recipe: str, source: str, config: dict[str, object],
               fill: Callable[[Path], None], parent: Path | None = None) -> Path:
        """The image's tree, unless its recipe is built already: a staging folder (the parent's tree as hard links,
        or empty), `fill(tree)`, the metadata, then put in place of the old one; nothing is left of a failure."""
        final = rootfs.image_dir(self.rootfs_dir, name)
        if self._current(name, recipe):
            return final
        staging = self._staging(name)
        tree = staging / TREE
        try:
            if parent is not None:
                clone_tree(parent, tree)
            else:
                tree.mkdir()
            fill(tree)
            return self._install(name, staging, self._image(name, recipe, source, tree, config))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise

    # -- base -----------------------------------------------------------------------------------------

    def base(self, name: str, suite: str, mirror: str, from_tar: Path | None) -> Path:
        source = f"tar {from_tar.name} {tree_digest_file(from_tar)}" if from_tar else f"debootstrap {suite} {mirror}"

        def fill(tree: Path) -> None:
            if from_tar:
                log(f"{name}: unpacking {from_tar}")
                subprocess.run(["tar", "-C", str(tree), "--numeric-owner", "-xf", str(from_tar)], check=True)
            else:
                if os.geteuid() != 0:
                    raise BuildError("debootstrap needs root; as another user build the base from a tarball of a "
                                     "Debian root filesystem made elsewhere: base --from-tar FILE")
                if shutil.which("debootstrap") is None:
                    raise BuildError("debootstrap not found: apt-get install debootstrap")
                log(f"{name}: debootstrap --variant=minbase --include=python3 {suite} ({mirror}; about a minute)")
                done = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", suite, str(tree),
                                       mirror], capture_output=True, text=True)
                if done.returncode != 0:
                    raise BuildError(f"debootstrap failed: {done.stdout[-1500:]}{done.stderr[-1500:]}")
            for rel in SLIMMED:
                shutil.rmtree(tree / rel, ignore_errors=True)
                (tree / rel).mkdir(parents=True, exist_ok=True)
            # bwrap mounts /dev, /proc and /tmp itself: the folders are mount points only.
            for rel in ("dev", "proc", "sys", "tmp"):
                shutil.rmtree(tree / rel, ignore_errors=True)
                (tree / rel).mkdir()
            os.chmod(tree / "tmp", 0o755)  # a mount point: each sandbox's /tmp is a tmpfs of its own
            sources = tree / "etc/apt/sources.list"
            if not sources.exists() or not sources.read_text().strip():
                write_new(sources, f"deb {mirror} {suite} main\n")
            python = run_in(tree, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip()
            log(f"{name}: python {python}")

        return self._build(name, _digest("base", source), source, {"env": BASE_ENV}, fill)

    # -- sandbox_images/python -------------------------------------------------------------------------

    def sandbox(self, name: str, base: str, dockerfile: Path) -> Path:
        parent, parent_meta = self._parent(base)
        config = dockerfile_config(dockerfile)
        config["env"] = {**dict(parent_meta.get("env") or {}), **config["env"]}  # type: ignore[dict-item]
        recipe = _digest("sandbox", str(parent_meta.get("recipe")), rootfs.runtime_digest(), dockerfile.read_text())

        def fill(tree: Path) -> None:
            log(f"{name}: from {base}; the user 1000 'sandbox', /workspace, the runtime at /opt/tito")
            passwd, group = tree / "etc/passwd", tree / "etc/group"
            if not re.search(r"^[^:]*:[^:]*:1000:", passwd.read_text(), re.M):
                write_new(passwd, passwd.read_text() + "sandbox:x:1000:1000::/workspace:/usr/sbin/nologin\n")
            if not re.search(r"^[^:]*:[^:]*:1000:", group.read_text(), re.M):
                write_new(group, group.read_text() + "sandbox:x:1000:\n")
            workspace = tree / str(config.get("workdir", "/workspace")).strip("/")
            workspace.mkdir(parents=True, exist_ok=True)
            os.chmod(workspace, 0o700)
            opt = tree / "opt/tito"
            opt.mkdir(parents=True, exist_ok=True)
            for f in rootfs.runtime_files():
                shutil.copyfile(f, opt / f.name)  # copies: the runtime's files stay writable in the checkout
            compile_runtime(tree)
            for p in opt.rglob("*"):
                os.chmod(p, 0o755 if p.is_dir() else 0o444)

        return self._build(name, recipe, f"recipe {dockerfile}", config, fill, parent)

    # -- sandbox_images/scientific ------------------------------------------------------------------------

    def scientific(self, name: str, parent_name: str, site: Path) -> Path:
        parent, parent_meta = self._parent(parent_name)

        def fill(tree: Path) -> None:
            log(f"{name}: from {parent_name}; {site} at /opt/tito/scientific")
            add_tree(site, tree / "opt/tito/scientific")
            add_pth(tree, "tito-scientific.pth", "/opt/tito/scientific")
            said = run_in(tree, ["python3", "-I", "-c", "import numpy, scipy, sympy, pandas, matplotlib; "
                                 "print('scientific stack', numpy.__version__, pandas.__version__)"])
            log(f"{name}: {said.strip()}")

        recipe = _digest("scientific", str(parent_meta.get("recipe")), listing_digest(site))
        return self._build(name, recipe, "recipe sandbox_images/scientific", parent_meta, fill, parent)

    # -- sandbox_images/task -------------------------------------------------------------------------------

    def task(self, name: str, parent_name: str, context: Path) -> Path:
        repo, site = context / "repo", context / "site"
        if not repo.is_dir():
            raise BuildError(f"{context} has no repo/ folder (scripts/build_task_images.sh prepares it)")
        if (repo / ".git").exists():
            raise BuildError(f"{repo} holds .git: its history may hold the fix; ship a plain tree")
        parent, parent_meta = self._parent(parent_name)

        def fill(tree: Path) -> None:
            log(f"{name}: from {parent_name}; the repository at /opt/tito-task/repo")
            add_tree(repo, tree / "opt/tito-task/repo")
            if site.is_dir():
                add_tree(site, tree / "opt/tito-task/site")
            (tree / "opt/tito-task/site").mkdir(exist_ok=True)
            add_pth(tree, "tito-task.pth", "/opt/tito-task/site")

        recipe = _digest("task", str(parent_meta.get("recipe")), tree_digest(context))
        return self._build(name, recipe, f"recipe sandbox_images/task, {context.name}", parent_meta, fill, parent)

    # -- from Docker -----------------------------------------------------------------------------------------

    def export(self, image: str, name: str) -> Path:
        """The root filesystem of a built Docker image, exactly (docker create + export), and its config."""
        docker = shutil.which("docker")
        if docker is None:
            raise BuildError("export needs the docker CLI and a daemon; without Docker build from the recipe")
        inspect = subprocess.run([docker, "image", "inspect", image], capture_output=True, text=True)
        if inspect.returncode != 0:
            raise BuildError(f"docker image inspect {image}: {inspect.stderr.strip()}")
        info = json.loads(inspect.stdout)[0]
        cfg = info.get("Config") or {}
        config = {"env": dict(e.split("=", 1) for e in cfg.get("Env") or [] if "=" in e), "cmd": cfg.get("Cmd") or [],
                  "workdir": cfg.get("WorkingDir") or "/workspace"}

        def fill(tree: Path) -> None:
            cid = subprocess.run([docker, "create", image], capture_output=True, text=True, check=True).stdout.strip()
            try:
                log(f"{name}: docker export {image}")
                exporter = subprocess.Popen([docker, "export", cid], stdout=subprocess.PIPE)
                subprocess.run(["tar", "-C", str(tree), "--numeric-owner", "-x"], stdin=exporter.stdout, check=True)
                if exporter.wait() != 0:
                    raise BuildError(f"docker export {image} failed")
            finally:
                subprocess.run([docker, "rm", "-f", cid], capture_output=True)
            for rel in ("dev", "proc", "sys", "tmp"):
                (tree / rel).mkdir(exist_ok=True)
            if (tree / "opt/tito").is_dir():
                compile_runtime(tree)

        recipe = _digest("export", info["Id"], rootfs.runtime_digest())
        return self._build(name, recipe, f"docker export {image} {info['Id'][:19]}", config, fill)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m env_server.sandbox.bwrap.rootfs_build",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--rootfs-dir", type=Path, default=None,
                   help="where root filesystems live (default: sandbox.bwrap.rootfs_dir's default, "
                        f"{rootfs.default_rootfs_dir()})")
    p.add_argument("--force", action="store_true", help="rebuild even when the recipe digest is there")
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("base", help="a Debian base with python3 (debootstrap, as root; or --from-tar)")
    b.add_argument("--name", default="base-bookworm")
    b.add_argument("--suite", default=os.environ.get("TITO_DEBIAN_SUITE", "bookworm"))
    b.add_argument("--mirror", default=os.environ.get("TITO_DEBIAN_MIRROR", "http://deb.debian.org/debian"))
    b.add_argument("--from-tar", type=Path, help="a tarball of a Debian root filesystem with python3 instead")
    s = sub.add_parser("sandbox", help="the python sandbox image's root filesystem")
    s.add_argument("--image", default=SANDBOX_IMAGE)
    s.add_argument("--base", default="base-bookworm")
    s.add_argument("--dockerfile", type=Path, default=Path("sandbox_images/python/Dockerfile"))
    c = sub.add_parser("scientific", help="the scientific sandbox image's root filesystem")
    c.add_argument("--image", default=SCIENTIFIC_IMAGE)
    c.add_argument("--from", dest="parent", default=SANDBOX_IMAGE)
    c.add_argument("--site", type=Path, required=True, help="the packages, installed for the rootfs's Python")
    t = sub.add_parser("task", help="a task's root filesystem from its prepared context (repo/, site/)")
    t.add_argument("context", type=Path)
    t.add_argument("--image", required=True)
    t.add_argument("--from", dest="parent", default=SANDBOX_IMAGE)
    e = sub.add_parser("export", help="a built Docker image's root filesystem, exactly")
    e.add_argument("image")
    e.add_argument("--as", dest="name", help="the image name it serves as (default: the same)")
    k = sub.add_parser("check", help="load root filesystems as the server does")
    k.add_argument("images", nargs="+")
    v = sub.add_parser("python-version", help="the major.minor of a root filesystem's python3")
    v.add_argument("image")
    args = p.parse_args(argv)
    builder = Builder(args.rootfs_dir or rootfs.default_rootfs_dir(), force=args.force)
    try:
        if args.command == "base":
            builder.base(args.name, args.suite, args.mirror, args.from_tar)
        elif args.command == "sandbox":
            builder.sandbox(args.image, args.base, args.dockerfile)
        elif args.command == "scientific":
            builder.scientific(args.image, args.parent, args.site)
        elif args.command == "task":
            builder.task(args.image, args.parent, args.context)
        elif args.command == "export":
            builder.export(args.image, args.name or args.image)
        elif args.command == "check":
            for image in args.images:
                found = rootfs.load(builder.rootfs_dir, image)
                print(f"{image}: {found.path} ({found.source}, built {found.built_at})")
        elif args.command == "python-version":
            tree = rootfs.image_dir(builder.rootfs_dir, args.image) / TREE
            print(run_in(tree, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"]).strip())
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        print(f"[rootfs] ERROR: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - BackendUnavailable from check, said in one line
        print(f"[rootfs] ERROR: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
