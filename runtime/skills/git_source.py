"""Git repositories as a ``tidegate skills install`` source (seed 001 §7: "PATH|URL of a
git repo").

A spec is ``URL[#REF]``: ``https://``, ``http://``, ``ssh://``, ``git://``, ``file://``
URLs, scp-like ``user@host:path``, any of them prefixed ``git+``, or a local path to a
bare repository (a work tree is installed as a plain directory, its ``.git`` left out). ``REF`` is a branch or tag (default: the remote's
HEAD). The repository is cloned with the real ``git`` binary, shallow (``--depth 1``),
without submodules, hooks or prompts (``GIT_TERMINAL_PROMPT=0``), with the ``ext::`` and
``fd::`` transports refused and under a timeout; the clone's tree then goes through the
same checks as a local directory (``runtime/skills/install.py``). Source: git-clone(1),
git-config(1) ``protocol.<name>.allow``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

_URL = re.compile(r"^(?:git\+)?(?:https?|ssh|git|file)://", re.IGNORECASE)
_SCP = re.compile(r"^[\w.-]+@[\w.-]+:(?!//)")
_REF = re.compile(r"^[\w./-]{1,200}$")


class GitSourceError(ValueError):
    """The repository could not be cloned; the message says why (no secrets: URLs are
    shown without credentials)."""


def _is_repo_dir(path: Path) -> bool:
    return (path / "HEAD").is_file() and (path / "objects").is_dir()


def is_git_source(spec: str) -> bool:
    """Whether ``spec`` names a git repository rather than a directory or archive."""
    url = spec.split("#", 1)[0]
    if _URL.match(url) or _SCP.match(url):
        return True
    path = Path(url).expanduser()
    return path.is_dir() and _is_repo_dir(path)  # a bare repository (a work tree is a dir)


def _redact(url: str) -> str:
    return re.sub(r"//[^/@]*@", "//***@", url)


def split_spec(spec: str) -> tuple[str, str | None]:
    """``(url, ref)`` of ``URL[#REF]``; ``git+`` dropped. Raises GitSourceError for a
    malformed ref."""
    url, _, ref = spec.partition("#")
    if url.lower().startswith("git+"):
        url = url[4:]
    if ref and (not _REF.match(ref) or ref.startswith("-") or ".." in ref):
        raise GitSourceError(f"invalid git ref {ref!r}")
    return url, ref or None


def clone(spec: str, into: Path, *, timeout: float = 120.0) -> Path:
    """Clone ``spec`` into ``into`` (must not exist); returns ``into``. Raises
    GitSourceError when git is missing, the clone fails or times out."""
    git = shutil.which("git")
    if git is None:
        raise GitSourceError("git is not installed (needed to install skills from a "
                             "repository)")
    url, ref = split_spec(spec)
    cmd = [git, "-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never",
           "-c", "core.hooksPath=/dev/null", "clone", "--quiet", "--depth", "1",
           "--no-recurse-submodules", "--no-tags"]
    if ref:
        cmd += ["--branch", ref]
    cmd += ["--", url, str(into)]
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true",
           "GIT_CONFIG_NOSYSTEM": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise GitSourceError(f"git clone {_redact(url)}: timed out after {timeout:g}s") \
            from None
    if proc.returncode != 0:
        err = " ".join(proc.stderr.split())[-400:] or f"exit {proc.returncode}"
        raise GitSourceError(f"git clone {_redact(url)} failed: {_redact(err)}")
    head = subprocess.run([git, "-C", str(into), "rev-parse", "HEAD"], capture_output=True,
                          text=True, timeout=30, env=env)
    log.info("skills_git_cloned", url=_redact(url), ref=ref, commit=head.stdout.strip())
    return into
