"""The protocol's file operations on real sandboxes: write_files (replace, remove, batches), copy_tree,
hash_tree, read_files, and the shell's working directory in its reply. None of them follows a link."""

from __future__ import annotations

import hashlib

import pytest

from env_server.sandbox.errors import SandboxError


async def test_write_files_in_batches_replace_and_remove(sandbox):
    big = {f"data/part{i}.bin": bytes([i]) * 400_000 for i in range(3)}  # > max_code_bytes together: 2+ requests
    await sandbox.write_files({**big, "keep.txt": b"keep", "gone/deep/x.txt": b"x"})
    tree = await sandbox.hash_tree()
    assert tree.files == {p: hashlib.sha256(b).hexdigest() for p, b in {**big, "keep.txt": b"keep",
                                                                          "gone/deep/x.txt": b"x"}.items()}
    assert tree.sizes["data/part0.bin"] == 400_000
    with pytest.raises(SandboxError, match="File exists"):
        await sandbox.write_files({"keep.txt": b"again"})
    await sandbox.write_files({"keep.txt": b"new"}, replace=True, remove=["gone/deep/x.txt", "not/there.txt"])
    read, missing = await sandbox.read_files(["keep.txt", "gone/deep/x.txt"])
    assert read == {"keep.txt": b"new"} and missing == ["gone/deep/x.txt"]
    r = await sandbox.run_shell("ls -d gone 2>&1; echo $?")
    assert "No such file" in r.stdout  # the folders it left empty went too
    with pytest.raises(SandboxError, match="is a folder"):
        await sandbox.write_files({}, remove=["data"])
    with pytest.raises(SandboxError, match="at most"):
        await sandbox.write_files({"huge.bin": b"0" * sandbox.config.max_code_bytes})


async def test_nothing_follows_a_link(sandbox):
    r = await sandbox.run_shell("ln -s /tmp/target link && ln -s /tmp dirlink && ln -s /etc/passwd pw && mkfifo fifo")
    assert r.exit_code == 0, r
    await sandbox.write_files({"link": b"data"}, replace=True)  # the link is replaced, its target untouched
    r = await sandbox.run_shell("test -L link || echo not-a-link; cat link; ls /tmp/target 2>&1 | head -1")
    assert r.stdout.startswith("not-a-link\ndata") and "No such file" in r.stdout, r
    with pytest.raises(SandboxError, match="not a folder"):
        await sandbox.write_files({"dirlink/evil.txt": b"x"})  # a link where a folder is expected
    tree = await sandbox.hash_tree()
    assert tree.links == {"dirlink": "/tmp", "pw": "/etc/passwd"} and tree.skipped == ["fifo"]
    read, missing = await sandbox.read_files(["pw", "fifo", "dirlink/x", "link"])
    assert read == {"link": b"data"} and sorted(missing) == ["dirlink/x", "fifo", "pw"]
    with pytest.raises(SandboxError, match="bad path"):
        await sandbox.read_files(["../etc/passwd"])


async def test_hash_tree_skips_names_at_any_depth_and_stops_at_max_files(sandbox):
    await sandbox.write_files({"a.py": b"a", "pkg/__pycache__/a.cpython-311.pyc": b"c", "pkg/b.pyc": b"c",
                               "pkg/c.py": b"c", ".cache/pip/x": b"x"})
    tree = await sandbox.hash_tree(skip=["__pycache__", "*.pyc", ".cache"])
    assert sorted(tree.files) == ["a.py", "pkg/c.py"] and not tree.truncated
    tree = await sandbox.hash_tree(max_files=2)
    assert len(tree.files) == 2 and tree.truncated


async def test_copy_tree_copies_an_image_folder_once(sandbox):
    assert await sandbox.copy_tree("/no/such/folder", missing_ok=True) == 0
    with pytest.raises(SandboxError, match="not a folder"):
        await sandbox.copy_tree("/no/such/folder")
    count = await sandbox.copy_tree("/opt/tito")  # the runtime folder every image has
    assert count >= 5
    tree = await sandbox.hash_tree()
    assert "repl_server.py" in tree.files and "repl_editor.py" in tree.files
    with pytest.raises(SandboxError, match="File exists"):
        await sandbox.copy_tree("/opt/tito")


async def test_the_shell_reply_says_where_the_shell_is(sandbox):
    r = await sandbox.run_shell("cd /tmp")
    assert r.cwd == "/tmp" and r.exit_code == 0
    r = await sandbox.run_shell("mkdir -p $'/tmp/a\\nb' && cd $'/tmp/a\\nb'")
    assert r.cwd == "/tmp/a?b", r
