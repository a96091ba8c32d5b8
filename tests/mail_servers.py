"""Real mail servers for the email channel tests: Debian's Dovecot (IMAP) and aiosmtpd
(SMTP), both on free ports on 127.0.0.1, in a temp dir.

:class:`Dovecot` writes a minimal ``dovecot.conf`` (passwd-file passdb, static userdb,
maildir in the temp dir, ``base_dir``/``state_dir``/log in the temp dir; a self-signed
certificate made with ``openssl``: ``port`` speaks plain IMAP and offers STARTTLS,
``tls_port`` implicit TLS, ``ca_file`` verifies both) and runs ``dovecot -F``. Its
login processes refuse to run as root, so under root the whole server runs as an
unprivileged account (``nobody``) through ``subprocess``'s ``user=``, and
``default_internal_user``/``default_login_user`` are that account; otherwise they are the
current user. ``stop()``/``start()`` keep the port and the mail (an outage). A missing
binary raises :class:`MailServerMissing` (the fixture fails, never skips; ``.ci/run``
installs ``dovecot-imapd``).

:class:`SmtpSink` is aiosmtpd's ``Controller`` (its own thread and loop): every mail the
gateway submits is kept as bytes in ``received`` with its envelope; while ``down`` it
answers every DATA with a temporary failure (451), as a mail server in trouble does.
"""

from __future__ import annotations

import contextlib
import imaplib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

INSTALL_HINT = "install Dovecot (Debian: apt-get install -y dovecot-imapd; .ci/run does it)"
DOVECOT = "/usr/sbin/dovecot"
PASSWORD = "s3cret-imap-pass"


class MailServerMissing(RuntimeError):
    """Dovecot (or aiosmtpd) is not installed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dovecot:
    """A throwaway Dovecot IMAP server with the users ``users`` (password
    :data:`PASSWORD`). ``port`` is fixed for the object's life."""

    def __init__(self, users: tuple[str, ...] = ("bot",)) -> None:
        binary = shutil.which("dovecot") or (DOVECOT if os.path.exists(DOVECOT) else None)
        if binary is None:
            raise MailServerMissing(INSTALL_HINT)
        self.binary = binary
        self.port = free_port()
        self.tls_port = free_port()  # implicit TLS (imaps); ``port`` also offers STARTTLS
        self.users = users
        self.dir = Path(tempfile.mkdtemp(prefix="tidegate-dovecot-"))
        self.account = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.getuid()).pw_name
        self.proc: subprocess.Popen | None = None
        self._write_config()

    def _write_config(self) -> None:
        pw = pwd.getpwnam(self.account)
        group = self._group(pw.pw_gid)
        d = self.dir
        for sub in ("mail", "base", "state"):
            (d / sub).mkdir()
        (d / "users").write_text("".join(f"{u}:{{PLAIN}}{PASSWORD}::::::\n"
                                         for u in self.users))
        self.ca_file = self._certificate()
        (d / "dovecot.conf").write_text(f"""\
protocols = imap
listen = 127.0.0.1
ssl = yes
ssl_cert = <{d}/cert.pem
ssl_key = <{d}/key.pem
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
base_dir = {d}/base
state_dir = {d}/state
log_path = {d}/dovecot.log
default_internal_user = {self.account}
default_internal_group = {group}
default_login_user = {self.account}
first_valid_uid = 0
mail_location = maildir:{d}/mail/%u
passdb {{
  driver = passwd-file
  args = {d}/users
}}
userdb {{
  driver = static
  args = uid={pw.pw_uid} gid={pw.pw_gid} home={d}/mail/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {self.port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {self.tls_port}
    ssl = yes
  }}
}}
service anvil {{
  chroot =
  # no growing delay after a refused login (tests refuse some on purpose)
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
""")
        if os.geteuid() == 0:
            for path in [d, *d.rglob("*")]:
                os.chown(path, pw.pw_uid, pw.pw_gid)

    def _certificate(self) -> Path:
        """A self-signed certificate for 127.0.0.1 and localhost (``cert.pem``, which is
        also the CA file a client verifies it with) and its key, made with ``openssl``
        (a dependency of Debian's dovecot-core)."""
        cert, key = self.dir / "cert.pem", self.dir / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                        "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=IP:127.0.0.1,DNS:localhost",
                        "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True, timeout=30)
        return cert

    @staticmethod
    def _group(gid: int) -> str:
        import grp
        return grp.getgrgid(gid).gr_name

    def start(self, timeout: float = 15.0) -> Dovecot:
        """Start the server and wait until it greets on ``port``. Raises RuntimeError
        (with the log's tail) when it does not come up."""
        kwargs: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam(self.account)
            kwargs = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
        self.proc = subprocess.Popen([self.binary, "-F", "-c", str(self.dir / "dovecot.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True, **kwargs)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dovecot exited: {self.proc.stderr.read().decode()[-2000:]}"
                                   f"\n{self.log()[-2000:]}")
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.settimeout(2)
                    if s.recv(64).startswith(b"* OK"):
                        return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"dovecot did not greet in {timeout}s: {self.log()[-2000:]}")

    def stop(self) -> None:
        """Stop the server and every process of it (SIGTERM to its process group: the
        ``imap`` processes of open connections outlive a stopped master otherwise), so
        clients see their connections close, as in a real outage."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
        self.proc = None
        deadline = time.monotonic() + 5  # the master's children close their sockets
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                return
            time.sleep(0.05)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "dovecot.log").read_text(errors="replace")
        except OSError:
            return ""

    @contextlib.contextmanager
    def imap(self, user: str = "bot"):
        """A logged-in stdlib ``imaplib`` client with INBOX selected."""
        client = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        try:
            client.login(user, PASSWORD)
            client.select("INBOX")
            yield client
        finally:
            with contextlib.suppress(Exception):
                client.logout()

    def deliver(self, mail: bytes | EmailMessage, user: str = "bot") -> int:
        """Put ``mail`` into ``user``'s INBOX (IMAP APPEND); returns its UID."""
        raw = mail.as_bytes() if isinstance(mail, EmailMessage) else mail
        with self.imap(user) as c:
            typ, data = c.append("INBOX", None, None, raw)
            assert typ == "OK", data
            text = data[0].decode()
        return int(text.split("APPENDUID ")[1].split()[1].rstrip("]"))

    def renumber(self, user: str, uidvalidity: int) -> None:
        """With the server stopped: forget ``user``'s UIDs and indexes, so that at the
        next start the mails of INBOX get new UIDs under ``uidvalidity`` (what a restore
        or a migration of the mailbox does)."""
        assert self.proc is None, "stop the server first"
        box = self.dir / "mail" / user
        for path in box.iterdir():
            if path.name.startswith("dovecot"):
                path.unlink()
        uidlist = box / "dovecot-uidlist"
        uidlist.write_text(f"3 V{uidvalidity} N1\n")
        owner = box.stat()
        if os.geteuid() == 0:
            os.chown(uidlist, owner.st_uid, owner.st_gid)

    def flags(self, uid: int, user: str = "bot") -> str:
        with self.imap(user) as c:
            _typ, data = c.uid("FETCH", str(uid), "(FLAGS)")
            return data[0].decode() if data and data[0] else ""


class SmtpSink:
    """aiosmtpd on a free port; ``received``: ``(mail_from, rcpt_tos, bytes)`` of every
    accepted mail. With ``password`` it offers AUTH, accepts only that password and no mail
    without a login (530). ``refuse_next(n, code)`` answers the next ``n`` DATA with ``code``."""

    def __init__(self, password: str | None = None) -> None:
        try:
            from aiosmtpd.controller import Controller
            from aiosmtpd.smtp import AuthResult
        except ImportError as exc:  # pragma: no cover - a test dependency
            raise MailServerMissing("pip install aiosmtpd") from exc
        self.received: list[tuple[str, list[str], bytes]] = []
        self._lock = threading.Lock()
        self._refuse: list[str] = []
        self.down = False
        self.port = free_port()
        auth: dict[str, Any] = {}
        if password is not None:  # AUTH PLAIN/LOGIN offered (over plain text: a test)
            def check(_server: Any, _session: Any, _env: Any, _mech: str, data: Any) -> Any:
                ok = bytes(data.password) == password.encode()
                return AuthResult(success=ok, handled=False)  # handled: no 535 sent
            auth = {"authenticator": check, "auth_require_tls": False, "auth_required": True}
        self.controller = Controller(self, hostname="127.0.0.1", port=self.port, **auth)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self._lock:
            if self.down:
                return "451 4.3.0 mail server temporarily unavailable"
            if self._refuse:
                return self._refuse.pop(0)
            self.received.append((envelope.mail_from, list(envelope.rcpt_tos),
                                  bytes(envelope.original_content or envelope.content)))
        return "250 OK"

    def refuse_next(self, n: int, reply: str = "451 4.3.0 try again later") -> None:
        with self._lock:
            self._refuse.extend([reply] * n)

    def mails(self) -> list[EmailMessage]:
        with self._lock:
            return [message_from_bytes(raw, policy=policy.default)  # type: ignore[misc]
                    for _f, _t, raw in self.received]

    def start(self) -> SmtpSink:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()
