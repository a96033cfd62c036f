"""Root filesystems of the bwrap backend: one read-only directory per image name, shared by all its sandboxes.

    <rootfs_dir>/<image key>/root/        the tree a sandbox sees as /
    <rootfs_dir>/<image key>/image.json   what the image's config says (env, cmd, working dir, user) and the
                                          stamp: the runtime digest, the recipe digest, how and when it was built

`<image key>` is the image name made a file name (`tito-sandbox-python:latest` -> `tito-sandbox-python_latest`),
so `sandbox.image`, an environment's image and a session's task image name a root filesystem exactly as they
name a Docker image. rootfs_build.py makes them, from the same recipe as the images or from a built image.

The stamp's runtime digest is the REPL runtime's (runtime/*.py): a root filesystem made from another version of
the runtime would speak another protocol, so it counts as missing until it is rebuilt. A root filesystem that
anyone but root (or the server's own user) could write into is refused: every sandbox of the image would see what
they put there (`unsafe_paths`; the builder hardens trees, rootfs_tree.harden).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from .. import runtime
from ..errors import BackendUnavailable

METADATA = "image.json"
TREE = "root"
RUNTIME_DIR = Path(runtime.__file__).resolve().parent
BUILD_HINT = ("build it with scripts/build_rootfs.sh (TITO_SANDBOX_BACKEND=bwrap scripts/setup.sh builds the "
              "project's images' root filesystems; scripts/build_task_images.sh the example tasks')")


def default_rootfs_dir() -> Path:
    """$TITO_ROOTFS_DIR, else /var/lib/tito/rootfs as root, else ~/.cache/tito/rootfs."""
    if os.environ.get("TITO_ROOTFS_DIR"):
        return Path(os.environ["TITO_ROOTFS_DIR"])
    if os.geteuid() == 0:
        return Path("/var/lib/tito/rootfs")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tito" / "rootfs"


def image_key(image: str) -> str:
    """The folder name of an image's root filesystem."""
    key = re.sub(r"[^A-Za-z0-9_.-]", "_", image)
    if not key.strip("._"):
        raise ValueError(f"{image!r} is not an image name")
    return key


def runtime_files() -> list[Path]:
    """The REPL runtime's files, as they go to /opt/tito (the package marker stays behind)."""
    return sorted(p for p in RUNTIME_DIR.glob("*.py") if p.name != "__init__.py")


def runtime_digest() -> str:
    h = hashlib.sha256()
    for p in runtime_files():
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class RootfsImage:
    """One image's root filesystem and the config a sandbox of it starts with."""

    image: str
    path: Path  # the tree
    env: dict[str, str] = field(default_factory=dict)
    cmd: tuple[str, ...] = ()
    workdir: str = "/workspace"
    runtime_digest: str = ""
    recipe: str = ""
    source: str = ""
    built_at: str = ""

    def metadata(self) -> dict[str, object]:
        return {"image": self.image, "env": self.env, "cmd": list(self.cmd), "workdir": self.workdir,
                "runtime_digest": self.runtime_digest, "recipe": self.recipe, "source": self.source,
                "built_at": self.built_at}


_checked: set[tuple[str, str]] = set()  # (tree, built_at) found safe by this process


def unsafe_paths(tree: Path, also: tuple[Path, ...] = ()) -> list[str]:
    """Paths in `tree` (and the folders `also`) that someone other than root or this process's user could
    write: writable by group or others, or owned by another user. Symbolic links are not followed."""
    owners = {0, os.geteuid()}
    found = []

    def check(path: str) -> None:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            return
        if st.st_mode & 0o022 or st.st_uid not in owners:
            found.append(f"{path} (mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid})")

    for path in also:
        check(str(path))
    for folder, dirs, files in os.walk(tree):
        check(folder)
        for name in files:
            check(os.path.join(folder, name))
    return found


def check_permissions(image: RootfsImage, rootfs_dir: Path) -> None:
    """Raises BackendUnavailable if anyone but root (or this user) could write into the image's root filesystem."""
    key = (str(image.path), image.built_at)
    if key in _checked:
        return
    found = unsafe_paths(image.path, also=(rootfs_dir, image.path.parent))
    if found:
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "")
        raise BackendUnavailable(
            f"the root filesystem of {image.image!r} ({image.path}) can be written by users other than root"
            f"{' and uid %d' % os.geteuid() if os.geteuid() else ''}: {shown}. Every sandbox of the image would see "
            "what they put there, so the server refuses it. Repair it with scripts/build_rootfs.sh (a re-run "
            "takes write permission for group and others off current root filesystems) or chmod go-w those "
            "paths and chown them to root")
    _checked.add(key)


def image_dir(rootfs_dir: Path, image: str) -> Path:
    return rootfs_dir / image_key(image)


def load(rootfs_dir: Path, image: str) -> RootfsImage:
    """The image's root filesystem, checked: present, complete and made from this runtime. Raises
    BackendUnavailable(missing_image=True) saying what is wrong and how to build it."""
    where = image_dir(rootfs_dir, image)
    try:
        meta = json.loads((where / METADATA).read_text())
    except FileNotFoundError:
        raise BackendUnavailable(f"no root filesystem for image {image!r} in {rootfs_dir} (looked for {where}); "
                                 f"{BUILD_HINT}", missing_image=True) from None
    except (OSError, ValueError) as exc:
        raise BackendUnavailable(f"the root filesystem of {image!r} has an unreadable {where / METADATA} ({exc}); "
                                 f"rebuild it: {BUILD_HINT}", missing_image=True) from None
    tree = where / TREE
    found = RootfsImage(image=image, path=tree, env=dict(meta.get("env") or {}), cmd=tuple(meta.get("cmd") or ()),
                        workdir=meta.get("workdir") or "/workspace", runtime_digest=meta.get("runtime_digest", ""),
                        recipe=meta.get("recipe", ""), source=meta.get("source", ""),
                        built_at=meta.get("built_at", ""))
    if found.runtime_digest != runtime_digest():
        raise BackendUnavailable(
            f"the root filesystem of {image!r} ({where}, built {found.built_at or 'at an unknown time'}) holds "
            f"another version of the REPL runtime (digest {found.runtime_digest or 'none'}, this server's "
            f"{runtime_digest()}); rebuild it: {BUILD_HINT}", missing_image=True)
    for needed in ("opt/tito/repl_server.py", found.workdir.strip("/"), "tmp", "proc", "dev"):
        if not os.path.lexists(tree / needed):
            raise BackendUnavailable(f"the root filesystem of {image!r} ({tree}) has no /{needed}; rebuild it: "
                                     f"{BUILD_HINT}", missing_image=True)
    check_permissions(found, rootfs_dir)
    return found
