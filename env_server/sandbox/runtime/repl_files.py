"""File operations on the session's working directory (stdlib only; runs in the container).

The protocol's write_files, copy_tree, hash_tree and read_files (repl_protocol.py): paths are relative to
the working directory; the host checked them, and this checks again on the real filesystem — every
component a plain name, folders real folders, never a link followed.
"""

import base64
import fnmatch
import hashlib
import os
import stat

import repl_protocol as protocol


class Workdir:
    def __init__(self, root):
        self.root = root

    def _inside(self, path):
        """The absolute path of a relative path; ValueError unless every component is a plain name."""
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
            raise ValueError("bad path %r" % path)
        return os.path.join(self.root, path)

    def _folders(self, path, make):
        """Checks (and with `make`, creates) the folders above `path`: real folders, never links.
        False when one is missing (and not made)."""
        folder = self.root
        for part in path.split("/")[:-1]:
            folder = os.path.join(folder, part)
            if make:
                try:
                    os.mkdir(folder, 0o755)
                    continue
                except FileExistsError:
                    pass
            if os.path.islink(folder) or not os.path.isdir(folder):
                if not make and not os.path.lexists(folder):
                    return False
                raise ValueError("%r: %r is not a folder" % (path, part))
        return True

    def write_files(self, req):
        """Creates each file (and its folders) under the working directory; never follows a link. An existing
        path is an error, or with `replace` a file or link there is removed first (a folder never is).
        `remove` deletes files or links first (a missing one is fine), and the folders that leaves empty."""
        for path in req.remove:
            full = self._inside(path)
            if self._folders(path, make=False) and os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    raise ValueError("%r is a folder, not a file" % path)
                os.unlink(full)
                folder = os.path.dirname(full)
                while folder != self.root and not os.listdir(folder):  # folders it leaves empty go too
                    os.rmdir(folder)
                    folder = os.path.dirname(folder)
        for path, data in req.files.items():
            full = self._inside(path)
            self._folders(path, make=True)
            if req.replace and os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    raise ValueError("%r is a folder, not a file" % path)
                os.unlink(full)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(data))
        return protocol.FilesWritten(id=req.id, count=len(req.files))

    def copy_tree(self, req):
        """Copies the image's folder `source` (files, folders, links as links, the executable bit) into the
        working directory; never over an existing path. No such folder: nothing, if `missing_ok`."""
        source = os.path.realpath(req.source)
        if not os.path.isdir(source):
            if req.missing_ok and not os.path.lexists(req.source):
                return protocol.FilesWritten(id=req.id, count=0)
            raise ValueError("%r is not a folder" % req.source)
        count = 0
        for top, folders, files in os.walk(source):
            rel = os.path.relpath(top, source)
            target = self.root if rel == "." else os.path.join(self.root, rel)
            if rel != ".":
                os.mkdir(target, 0o755)
            for name in folders + files:
                src, dst = os.path.join(top, name), os.path.join(target, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                    count += 1
                    if name in folders:
                        folders.remove(name)  # (os.walk does not enter it: links are copied as links)
                elif name in files and stat.S_ISREG(os.lstat(src).st_mode):
                    mode = 0o755 if os.lstat(src).st_mode & 0o111 else 0o644
                    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                        while True:
                            chunk = inp.read(1 << 20)
                            if not chunk:
                                break
                            out.write(chunk)
                    count += 1
        return protocol.FilesWritten(id=req.id, count=count)

    def hash_tree(self, req):
        """sha256 and size of every regular file under the working directory, the target of every link; names
        matching a `skip` pattern (files or folders, at any depth) left out; at most max_files entries."""
        reply = protocol.TreeHashes(id=req.id)
        for top, folders, files in os.walk(self.root):
            folders[:] = sorted(f for f in folders if not any(fnmatch.fnmatchcase(f, p) for p in req.skip))
            for name in sorted(files + [f for f in folders if os.path.islink(os.path.join(top, f))]):
                if any(fnmatch.fnmatchcase(name, p) for p in req.skip):
                    continue
                full = os.path.join(top, name)
                rel = os.path.relpath(full, self.root)
                if len(reply.files) + len(reply.links) + len(reply.skipped) >= req.max_files:
                    reply.truncated = True
                    return reply
                mode = os.lstat(full).st_mode
                if stat.S_ISLNK(mode):
                    reply.links[rel] = os.readlink(full)
                elif stat.S_ISREG(mode):
                    digest, size = hashlib.sha256(), 0
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        while True:
                            chunk = f.read(1 << 20)
                            if not chunk:
                                break
                            digest.update(chunk)
                            size += len(chunk)
                    reply.files[rel], reply.sizes[rel] = digest.hexdigest(), size
                else:
                    reply.skipped.append(rel)
            folders[:] = [f for f in folders if not os.path.islink(os.path.join(top, f))]
        return reply

    def read_files(self, req):
        """The bytes of each regular file (never through a link); others are listed as missing."""
        reply = protocol.FilesRead(id=req.id)
        root = os.path.realpath(self.root)
        for path in req.paths:
            full = self._inside(path)
            if not os.path.realpath(full).startswith(root + "/"):
                reply.missing.append(path)
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                reply.missing.append(path)
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    reply.missing.append(path)
                    continue
                reply.files[path] = base64.b64encode(f.read()).decode("ascii")
        return reply

