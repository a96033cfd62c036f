"""The builder's work on a root filesystem's tree: copies as hard links, new files as new inodes, commands run
inside it (bwrap), digests of folders, the modes no tree may keep (harden), and a Dockerfile's config lines.
rootfs_build.py composes them into the images' recipes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import subprocess
from pathlib import Path

BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class BuildError(Exception):
    pass


def log(message: str) -> None:
    print(f"[rootfs] {message}", flush=True)


def tree_digest(path: Path) -> str:
    """Names, modes and contents of a folder's files (what a task context holds)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        h.update(rel.encode() + b"\0" + oct(p.lstat().st_mode).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


# -- the Dockerfile's config lines ------------------------------------------------------------------------

def dockerfile_config(path: Path) -> dict[str, object]:
    """ENV, CMD and WORKDIR of a Dockerfile (the forms our Dockerfiles use): what a container of the image
    starts with, and so what a sandbox of its root filesystem starts with."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env: dict[str, str] = {}
    config: dict[str, object] = {"env": env}
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
        elif word == "CMD":
            config["cmd"] = json.loads(rest)
        elif word == "WORKDIR":
            config["workdir"] = rest.strip()
    return config


# -- trees ----------------------------------------------------------------------------------------------

def _link_or_copy(src: str, dst: str) -> None:
    if os.path.lexists(dst):
        os.unlink(dst)  # never written through: it may be a link to a parent's file
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or a file we may not link
        shutil.copy2(src, dst)


def clone_tree(src: Path, dst: Path) -> None:
    """`cp -al`: the tree again, its files as hard links (copies across filesystems)."""
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)


def add_tree(src: Path, dst: Path) -> int:
    """Adds `src`'s files under `dst` (as links where it can); how many files."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True)
    return sum(1 for p in dst.rglob("*") if not p.is_dir())


def write_new(path: Path, data: str, mode: int = 0o644) -> None:
    """Writes a file as a new inode: a hard-linked parent's copy is never changed."""
    tmp = path.with_name(path.name + ".tito-new")
    tmp.write_text(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def run_in(tree: Path, argv: list[str], *, writable: tuple[str, ...] = ()) -> str:
    """Runs a command in the tree: in bwrap (no network; `writable`: folders of the tree it may write), or, for
    root on a machine without bwrap (building Docker's base), in a chroot."""
    bwrap = shutil.which("bwrap")
    env = {**BASE_ENV}
    if bwrap is not None:
        cmd = [bwrap, "--unshare-all", "--die-with-parent", "--ro-bind", str(tree), "/"]
        for folder in writable:
            cmd += ["--bind", str(tree / folder.strip("/")), folder]
        cmd += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--clearenv",
                "--setenv", "PATH", BASE_ENV["PATH"], "--setenv", "LANG", "C.UTF-8", "--", *argv]
    elif os.geteuid() == 0 and shutil.which("chroot"):
        cmd = ["chroot", str(tree), *argv]
    else:
        raise BuildError("bwrap not found: install bubblewrap (apt-get install bubblewrap)")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise BuildError(f"{' '.join(argv)} failed in {tree} (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    return done.stdout


def compile_runtime(tree: Path) -> None:
    """Byte-compiles /opt/tito once at build time, not at every sandbox start (the root is read-only then)."""
    run_in(tree, ["python3", "-c", "import compileall, sys; sys.exit(not compileall.compile_dir('/opt/tito', "
                  "quiet=1))"], writable=("/opt/tito",))


def add_pth(tree: Path, file_name: str, folder: str) -> None:
    """A .pth in the system site-packages: importable by `python3` and by the REPL's `python3 -I` alike."""
    site_dir = run_in(tree, ["python3", "-c", "import site; print(site.getsitepackages()[0])"]).strip()
    target = tree / site_dir.strip("/")
    target.mkdir(parents=True, exist_ok=True)
    write_new(target / file_name, folder + "\n")


def listing_digest(path: Path) -> str:
    """Names and sizes of a folder's files: cheap, for large folders a tool wrote (pip --target)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(f"{p.relative_to(path).as_posix()}\0{p.lstat().st_size}\0".encode())
    return h.hexdigest()[:16]


def tree_digest_file(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return "none"


def harden(tree: Path) -> list[str]:
    """Takes write permission for group and others off everything in `tree` (Debian's /var/tmp and /run/lock are
    1777, /var/mail and /var/local group-writable): the tree is shared by every sandbox of the image, and a
    host user who could write into it could plant files they all see. The sandboxes' writable places are
    tmpfs mounts of their own. A file with other links (a parent image's) is replaced by a copy first, so the
    parent is never changed through a link. Returns the paths it changed, relative to the tree."""
    changed = []
    for folder, dirs, files in os.walk(tree):
        for name in [*dirs, *files] if folder != str(tree) else [".", *dirs, *files]:
            path = os.path.join(folder, name) if name != "." else folder
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o022:
                continue
            if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
                copy = path + ".tito-new"
                shutil.copy2(path, copy)
                os.replace(copy, path)
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
            changed.append(os.path.relpath(path, tree))
    return changed
