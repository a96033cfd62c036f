"""The bwrap backend's root filesystems: built without Docker from the images' recipes, shared by hard links,
stamped, and refused by the server when they hold another runtime."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

from env_server.sandbox import BackendUnavailable
from env_server.sandbox.bwrap import rootfs
from env_server.sandbox.bwrap.rootfs_build import BuildError, Builder, dockerfile_config
from tests.harness import REPO, SANDBOX_IMAGE

pytestmark = pytest.mark.bwrap


def test_the_sandbox_recipe_is_read_from_its_dockerfile():
    config = dockerfile_config(REPO / "sandbox_images/python/Dockerfile")
    assert config["cmd"] == ["python3", "-I", "/opt/tito/repl_server.py"] and config["workdir"] == "/workspace"
    assert config["env"] == {"HOME": "/workspace", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
                             "MPLBACKEND": "Agg"}


@pytest.fixture
def task_image(bwrap_ok):
    """A task root filesystem's name, removed afterwards."""
    name = f"tito-task-test-{uuid.uuid4().hex[:8]}:latest"
    yield name
    shutil.rmtree(rootfs.image_dir(rootfs.default_rootfs_dir(), name), ignore_errors=True)


def test_a_task_root_filesystem_links_its_parent_and_is_rebuilt_only_when_it_changes(task_image, tmp_path, capsys):
    context = tmp_path / "ctx"
    (context / "repo" / "pkg").mkdir(parents=True)
    (context / "repo" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (context / "site").mkdir()
    builder = Builder(rootfs.default_rootfs_dir())
    where = builder.task(task_image, SANDBOX_IMAGE, context)
    image = rootfs.load(rootfs.default_rootfs_dir(), task_image)
    parent = rootfs.load(rootfs.default_rootfs_dir(), SANDBOX_IMAGE)
    assert image.path == where / "root" and image.cmd == parent.cmd and image.env == parent.env
    assert (image.path / "opt/tito-task/repo/pkg/mod.py").read_text() == "VALUE = 1\n"
    # Shared with the parent by hard links: the same inode, nothing copied.
    runtime = Path("opt/tito/repl_server.py")
    assert os.stat(image.path / runtime).st_ino == os.stat(parent.path / runtime).st_ino
    pth = list((image.path / "usr").glob("**/tito-task.pth"))
    assert pth and pth[0].read_text() == "/opt/tito-task/site\n"

    built = json.loads((where / rootfs.METADATA).read_text())["built_at"]
    capsys.readouterr()
    builder.task(task_image, SANDBOX_IMAGE, context)  # unchanged: skipped
    assert "up to date" in capsys.readouterr().out
    (context / "repo" / "pkg" / "mod.py").write_text("VALUE = 2\n")
    builder.task(task_image, SANDBOX_IMAGE, context)  # changed: rebuilt, in place
    assert (image.path / "opt/tito-task/repo/pkg/mod.py").read_text() == "VALUE = 2\n"
    assert json.loads((where / rootfs.METADATA).read_text())["built_at"] >= built
    assert not list(where.parent.glob(f"{where.name}.*"))  # no staging or old folder left

    (context / "repo" / ".git").mkdir()
    with pytest.raises(BuildError, match="holds .git: its history may hold the fix"):
        builder.task(task_image, SANDBOX_IMAGE, context)


def test_a_root_filesystem_with_another_runtime_is_refused(task_image, tmp_path):
    context = tmp_path / "ctx"
    (context / "repo").mkdir(parents=True)
    where = Builder(rootfs.default_rootfs_dir()).task(task_image, SANDBOX_IMAGE, context)
    meta = json.loads((where / rootfs.METADATA).read_text())
    (where / rootfs.METADATA).write_text(json.dumps({**meta, "runtime_digest": "0" * 16}))
    with pytest.raises(BackendUnavailable, match="holds another version of the REPL runtime.*rebuild it") as info:
        rootfs.load(rootfs.default_rootfs_dir(), task_image)
    assert info.value.missing_image
    with pytest.raises(BackendUnavailable, match="no root filesystem for image 'tito-task-none:x'"):
        rootfs.load(rootfs.default_rootfs_dir(), "tito-task-none:x")
