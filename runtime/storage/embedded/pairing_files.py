"""Embedded pairing store: ``<state_dir>/pairing/<channel>.json``; writers take an
exclusive ``flock`` on ``<channel>.lock`` and replace the file atomically; readers
re-read it whenever its mtime/ctime/size/inode change."""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from runtime.fsutil import atomic_write


class PairingFiles:
    """The :class:`runtime.storage.pairing.PairingRecords` backend on files under ``dir``."""

    def __init__(self, dir: Path) -> None:
        self.dir = Path(dir)

    def _file(self, channel: str) -> Path:
        return self.dir / f"{channel}.json"

    def where(self, channel: str) -> str:
        return str(self._file(channel))

    def channels(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.json")) if self.dir.is_dir() else []

    def signature(self, channel: str) -> tuple[int, ...] | None:
        try:
            st = self._file(channel).stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)

    def read(self, channel: str) -> bytes | None:
        try:
            return self._file(channel).read_bytes()
        except FileNotFoundError:
            return None

    @contextmanager
    def locked(self, channel: str) -> Iterator[Callable[[bytes], None]]:
        self.dir.mkdir(parents=True, exist_ok=True)
        out: list[bytes] = []
        with open(self.dir / f"{channel}.lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield out.append
                if out:
                    atomic_write(self._file(channel), out[-1])
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
