"""A real, throwaway PostgreSQL server for the tests (and bench/): ``initdb`` + ``pg_ctl`` in a
temp dir, on a free TCP port on 127.0.0.1 and a private unix socket dir.

One server per test session; each test gets a fresh, empty database (``CREATE DATABASE``
from ``template0``, a few tens of ms with fsync off). The server runs with fsync,
synchronous_commit and full_page_writes off: it is thrown away, and the tests assert
behaviour, not crash safety of PostgreSQL itself.

Binaries: ``pg_config --bindir``, then PATH, then ``/usr/lib/postgresql/<newest>/bin``
(Debian keeps them there, off PATH). A missing binary raises :class:`PgMissing` with the
install hint, which the fixture turns into a test failure, never a skip (CI installs
Debian's ``postgresql`` package, see ``.ci/run``).

Root: ``initdb`` refuses to run as root, so under root the server's processes run as an
unprivileged account (``postgres`` when Debian's package created it, else ``nobody``)
via ``subprocess``'s ``user=``; the temp dir is handed to that account. The server's
superuser role is ``tidegate`` with trust auth on loopback and the socket only.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

INSTALL_HINT = "install PostgreSQL (Debian: apt-get install -y postgresql; .ci/run does it)"
ROLE = "tidegate"


class PgMissing(RuntimeError):
    """A PostgreSQL server binary is not installed."""


def find_bindir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``. Raises PgMissing."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
            if out:
                candidates.append(Path(out))
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(os.path.realpath(on_path)).parent)
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: [int(x) for x in Path(p).parent.name.split(".")
                                   if x.isdigit()])
    candidates.extend(Path(p) for p in reversed(debian))
    for d in candidates:
        if all((d / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return d
    raise PgMissing("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in "
                    f"{', '.join(map(str, candidates)) or 'pg_config --bindir, PATH or '}"
                    f"/usr/lib/postgresql/*/bin; {INSTALL_HINT}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as() -> str | None:
    """The account the server runs as: None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PgMissing("running as root and no unprivileged account (postgres or nobody) "
                    "exists to run initdb as")


class PgServer:
    """One PostgreSQL server. ``start()`` / ``stop()`` may be called repeatedly (tests cut
    the database away and bring it back); ``destroy()`` removes everything."""

    def __init__(self, *, durable: bool = False) -> None:
        self.durable = durable  # keep fsync/synchronous_commit on (bench/: real commits)
        self.bindir = find_bindir()
        self.user = _run_as()
        self.root = Path(tempfile.mkdtemp(prefix="tidegate-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.logfile = self.root / "server.log"
        self.port = free_port()
        self._names = itertools.count(1)
        self.sockets.mkdir()
        if self.user:
            info = pwd.getpwnam(self.user)
            for p in (self.root, self.sockets):
                os.chown(p, info.pw_uid, info.pw_gid)

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        kwargs = {"user": self.user} if self.user else {}
        if self.user:
            kwargs["group"] = pwd.getpwnam(self.user).pw_gid
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C",
               "HOME": str(self.root)}
        proc = subprocess.run([str(self.bindir / args[0]), *args[1:]], cwd=self.root,
                              env=env, capture_output=True, text=True, timeout=timeout,
                              **kwargs)
        if proc.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-3000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{args[0]} failed ({proc.returncode}): {proc.stderr.strip()}"
                               f"\n{proc.stdout.strip()}\n{log}")
        return proc

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", ROLE, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--locale=C", "--no-instructions")
        conf = "\n".join([
            f"port = {self.port}", "listen_addresses = '127.0.0.1'",
            f"unix_socket_directories = '{self.sockets}'",
            *(() if self.durable else ("fsync = off", "synchronous_commit = off",
                                       "full_page_writes = off")),
            "max_connections = 200",
            "shared_buffers = 32MB", "log_min_messages = warning",
            "max_locks_per_transaction = 256",
        ])
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("\n" + conf + "\n")

    def running(self) -> bool:
        try:
            self._run("pg_ctl", "-D", str(self.data), "status", timeout=30)
        except RuntimeError:
            return False
        return True

    def start(self) -> None:
        """Start the server (a no-op when it runs)."""
        if self.data.joinpath("postmaster.pid").exists() and self.running():
            return
        for _attempt in range(3):
            try:
                self._run("pg_ctl", "-D", str(self.data), "-l", str(self.logfile), "-w",
                          "-t", "60", "start")
                return
            except RuntimeError as exc:
                if "could not bind" not in str(exc) and "in use" not in str(exc):
                    raise
                self.port = free_port()  # lost the race for the port: take another
                with open(self.data / "postgresql.conf", "a") as fh:
                    fh.write(f"\nport = {self.port}\n")
        raise RuntimeError(f"PostgreSQL did not start; see {self.logfile}")

    def stop(self, mode: str = "fast") -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", timeout=60)

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, database: str = "postgres") -> str:
        """A libpq URL over TCP on 127.0.0.1 (what a deployment's config would hold)."""
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{database}"

    def socket_dsn(self, database: str = "postgres") -> str:
        """A libpq URL over the private unix socket dir."""
        return f"postgresql://{ROLE}@/{database}?host={self.sockets}&port={self.port}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` with psql over the socket; returns its unaligned output."""
        return self._run("psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h",
                         str(self.sockets), "-p", str(self.port), "-U", ROLE, "-d",
                         database, "-c", sql).stdout

    def create_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        name = f"t{os.getpid()}_{next(self._names)}"
        self.psql(f'CREATE DATABASE "{name}" TEMPLATE template0')
        return self.dsn(name)


def start_server(*, durable: bool = False) -> PgServer:
    """initdb + start; the caller owns ``destroy()``. ``durable`` keeps PostgreSQL's
    default fsync and synchronous_commit (bench/). Raises PgMissing / RuntimeError."""
    server = PgServer(durable=durable)
    try:
        server.init()
        server.start()
    except BaseException:
        server.destroy()
        raise
    return server
