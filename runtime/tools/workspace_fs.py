"""Race-free file access inside an agent workspace: every path is walked from a directory
fd of the workspace, one component at a time with ``O_NOFOLLOW``, and the final file is
opened, replaced or removed relative to its parent's fd.

Why: resolving a path string once and then opening it lets a process in the workspace (a
sandboxed background command) swap a component for a symlink in between, and the write
lands outside. Here no path string is ever re-resolved by the kernel: a symlink met on the
walk is read (``readlink``) and its target walked again the same way, so a link that stays
inside the workspace still works and one that leads out is refused.

Errors: :class:`ToolRefused` for an absolute path or one that leads outside (``..`` above
the root, a symlink out), :class:`ToolError` for a missing file, a non-directory in the
middle, too many links. ``rel`` is workspace-relative, ``/``-separated.
"""

from __future__ import annotations

import errno
import os
import secrets as _random
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.tools.registry import ToolError, ToolRefused

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # like the kernel's MAXSYMLINKS


def check_relative(rel: str) -> None:
    """Refuse an empty path, a NUL byte (ToolError) or an absolute / ``~`` path."""
    if not rel or "\x00" in rel:
        raise ToolError("path must be a non-empty relative path")
    if os.path.isabs(rel) or rel.startswith("~"):
        raise ToolRefused(f"path {rel!r} is absolute; use a path relative to the workspace")


def _outside(rel: str) -> ToolRefused:
    return ToolRefused(f"path {rel!r} is outside the workspace")


class _Walk:
    """The directory fds from the workspace root down to the current directory."""

    def __init__(self, root: Path, rel: str) -> None:
        self.root, self.rel = Path(os.path.realpath(root)), rel
        self.fds = [os.open(self.root, _DIR)]
        self.names: list[str] = []
        self.links = 0
        self.made: list[tuple[int, str]] = []  # (parent's index in fds, name) created

    def undo(self) -> None:
        """Remove the directories this walk created (still empty: a refused write must
        leave nothing behind), newest first."""
        for depth, name in reversed(self.made):
            if depth < len(self.fds):
                try:
                    os.rmdir(name, dir_fd=self.fds[depth])
                except OSError:
                    pass  # not empty (something else wrote there meanwhile): keep it
        self.made = []

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def up(self) -> None:
        if not self.names:
            raise _outside(self.rel)
        os.close(self.fds.pop())
        self.names.pop()
        # a directory made inside the one left has no open parent any more: keep it
        self.made = [(d, n) for d, n in self.made if d < len(self.fds)]

    def follow(self, name: str, pending: list[str]) -> None:
        """``name`` in the current directory is a symlink: put its target's components in
        front of ``pending`` (an absolute target restarts at the root)."""
        self.links += 1
        if self.links > MAX_LINKS:
            raise ToolError(f"path {self.rel!r}: too many symbolic links")
        target = os.readlink(name, dir_fd=self.fds[-1])
        if os.path.isabs(target):
            try:
                inner = Path(os.path.normpath(target)).relative_to(self.root)
            except ValueError:
                raise _outside(self.rel) from None
            while self.names:
                self.up()
            target = inner.as_posix()
        pending[:0] = [p for p in target.split("/") if p not in ("", ".")]

    def enter(self, name: str, pending: list[str], create: bool) -> None:
        """Step into directory ``name`` (created when missing and ``create``)."""
        try:
            fd = os.open(name, _DIR, dir_fd=self.fds[-1])
        except FileNotFoundError:
            if not create:
                raise ToolError("file not found") from None
            try:
                os.mkdir(name, 0o777, dir_fd=self.fds[-1])  # umask applies, as before
                self.made.append((len(self.fds) - 1, name))
            except FileExistsError:
                pass  # made meanwhile (or a link appeared): the retry sees which
            pending.insert(0, name)
            return
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if not stat.S_ISLNK(os.stat(name, dir_fd=self.fds[-1],
                                        follow_symlinks=False).st_mode):
                raise ToolError(f"path {self.rel!r}: {name!r} is not a directory") from None
            self.follow(name, pending)
            return
        self.fds.append(fd)
        self.names.append(name)


@contextmanager
def parent_of(workspace: Path, rel: str, *, create: bool = False
              ) -> Iterator[tuple[int, str, str]]:
    """``(parent dir fd, final name, canonical rel)`` of ``rel``; the final name is not a
    symlink when the walk ends (a link there is followed like the others) and may not
    exist. ``name`` is ``"."`` when ``rel`` names the workspace root or a directory by
    ``..``/``.``. ``create`` makes missing directories (0777 less the umask). The fd is closed on
    exit."""
    check_relative(rel)
    walk = _Walk(workspace, rel)
    try:
        pending = [p for p in rel.split("/") if p not in ("", ".")]
        name = "."
        while pending:
            part = pending.pop(0)
            if part == "..":
                walk.up()
                name = "."
            elif pending:
                walk.enter(part, pending, create)
            else:
                try:
                    mode = os.stat(part, dir_fd=walk.fds[-1], follow_symlinks=False).st_mode
                except FileNotFoundError:
                    name = part
                    break
                if stat.S_ISLNK(mode):
                    walk.follow(part, pending)
                    name = "."
                else:
                    name = part
        canon = "/".join([*walk.names, *([] if name == "." else [name])])
        try:
            yield walk.fds[-1], name, canon
        except ToolError:  # refused (``check``, a directory): undo the mkdirs
            walk.undo()
            raise
    finally:
        walk.close()


def open_read(workspace: Path, rel: str) -> tuple[int, str]:
    """An fd opened for reading (file or directory, never through a symlink) and the
    canonical rel. The caller closes the fd. Raises ToolError("file not found")."""
    with parent_of(workspace, rel) as (pfd, name, canon):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=pfd)
        except FileNotFoundError:
            raise ToolError("file not found") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # swapped for a link after the walk: refuse
                raise _outside(rel) from None
            raise
    mode = os.fstat(fd).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        os.close(fd)
        raise ToolError(f"path {rel!r} is not a regular file")
    return fd, canon


def kind(workspace: Path, rel: str) -> str | None:
    """``"file"``, ``"dir"``, ``"other"`` or None (missing) for ``rel``."""
    try:
        with parent_of(workspace, rel) as (pfd, name, _):
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except ToolError as exc:
        if str(exc) == "file not found":
            return None
        raise
    return "dir" if stat.S_ISDIR(st.st_mode) else \
        "file" if stat.S_ISREG(st.st_mode) else "other"


def read_bytes(workspace: Path, rel: str) -> bytes:
    """The bytes of regular file ``rel``. Raises ToolError (missing, a directory)."""
    fd, _ = open_read(workspace, rel)
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise ToolError(f"path {rel!r} is a directory; give a file path")
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def list_dir(fd: int) -> list[str]:
    """Sorted names in the directory open as ``fd`` (closed here), directories with a
    trailing ``/`` (a link is listed as itself, never followed)."""
    try:
        out = []
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            out.append(entry + ("/" if stat.S_ISDIR(st.st_mode) else ""))
        return sorted(out)
    finally:
        os.close(fd)


def write_bytes(workspace: Path, rel: str, data: bytes, *, mode: int | None = None,
                check: Callable[[str], None] | None = None, durable: bool = False) -> str:
    """Replace file ``rel`` atomically (a temp file in its parent, renamed over it inside
    the parent's fd), creating missing directories. ``mode``: None keeps the file's
    permissions (0600 for a new one); ``check(canonical rel)`` may raise to refuse once
    the real target is known; ``durable`` fsyncs the file and its directory. Returns the
    canonical rel. Raises ToolError for a
    directory."""
    with parent_of(workspace, rel, create=True) as (pfd, name, canon):
        if name == ".":
            raise ToolError(f"path {rel!r} is a directory; give a file path")
        if check is not None:
            check(canon)
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise ToolError(f"path {rel!r} is a directory; give a file path")
            keep = st.st_mode & 0o7777  # editing keeps a script's permissions
        except FileNotFoundError:
            keep = 0o600  # the workspace holds private notes, like the state dir
        tmp = f".{name[:200]}.{_random.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=pfd)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), keep if mode is None else mode)
                if durable:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=pfd, dst_dir_fd=pfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=pfd)
            except FileNotFoundError:
                pass
            raise
        if durable:
            os.fsync(pfd)
        return canon


def append_text(workspace: Path, rel: str, text: str,
                check: Callable[[str], None] | None = None) -> None:
    """Append ``text`` (UTF-8) to file ``rel`` (created 0600, directories too);
    ``check`` as for :func:`write_bytes`."""
    with parent_of(workspace, rel, create=True) as (pfd, name, canon):
        if name == ".":
            raise ToolError(f"path {rel!r} is a directory; give a file path")
        if check is not None:
            check(canon)
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        with os.fdopen(fd, "ab") as fh:
            fh.write(text.encode("utf-8"))


def unlink(workspace: Path, rel: str) -> None:
    """Remove file ``rel`` (a link there is removed itself, never its target)."""
    with parent_of(workspace, rel) as (pfd, name, _):
        if name == ".":
            raise ToolError(f"path {rel!r} is a directory; give a file path")
        try:
            os.unlink(name, dir_fd=pfd)
        except FileNotFoundError:
            raise ToolError("file not found") from None
