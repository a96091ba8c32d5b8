"""The env file: secrets kept next to the state, read by every command.

The rule (docs/configuration-secrets.md): ``<state_dir>/tidegate.env`` is read by default
by every command that loads the config (the foreground gateway included); ``--env-file
PATH`` names another file, ``--no-env-file`` reads none. A variable set in the process
environment wins over the file. The state dir comes from the config (or
``$TIDEGATE_STATE_DIR``, or the default), so the file is located after reading the
``gateway`` section; ``TIDEGATE_CONFIG`` and ``TIDEGATE_STATE_DIR`` in the file are
therefore ignored (they cannot move the file that sets them).

The format is systemd's ``EnvironmentFile=`` (systemd.exec(5)), the file the unit passes
too: under the unit the values arrive twice, identical, which is harmless.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_FILE_NAME = "tidegate.env"
LOOKUP_ONLY = ("TIDEGATE_CONFIG", "TIDEGATE_STATE_DIR")  # they locate the file itself


@dataclass(frozen=True)
class EnvFileChoice:
    """Which env file a command reads: ``path`` None = ``<state_dir>/tidegate.env`` when it
    exists; a path = that file, which must exist; ``enabled`` False = none at all."""

    path: Path | None = None
    enabled: bool = True

    def argv(self) -> list[str]:
        """The command-line flags that make another ``tidegate`` process choose the same."""
        if not self.enabled:
            return ["--no-env-file"]
        return ["--env-file", str(self.path.absolute())] if self.path else []


@dataclass
class EnvFileValues:
    """What was read: ``path`` None when no file was read; ``values`` NAME -> value."""

    path: Path | None = None
    values: dict[str, str] = field(default_factory=dict)

    def merged(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` over the file's values (the process environment wins)."""
        return {**{k: v for k, v in self.values.items() if k not in LOOKUP_ONLY}, **env}


class EnvFileError(ValueError):
    """An env file that cannot be read or parsed; the message names the file (and line)
    and never a value."""


def read_env_file(path: Path | str) -> dict[str, str]:
    """Parse a systemd ``EnvironmentFile=`` (systemd.exec(5)): ``NAME=value`` lines,
    ``#``/``;`` comments, blank lines, values optionally in single or double quotes
    (double quotes understand ``\\"`` and ``\\\\``), a leading ``export`` tolerated.

    Raises OSError when the file cannot be read and EnvFileError (a ValueError) naming
    the file and line for a line that is not ``NAME=value`` or text that is not UTF-8."""
    out: dict[str, str] = {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EnvFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise EnvFileError(f"{path}, line {no}: expected NAME=value")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            quote, value = value[0], value[1:-1]
            if quote == '"':
                value = value.replace('\\"', '"').replace("\\\\", "\\")
        out[name] = value
    return out


def read_chosen(choice: EnvFileChoice, state_dir: Path) -> EnvFileValues:
    """The env file ``choice`` names for a config whose state dir is ``state_dir``.

    The default file may be absent (nothing read); a file named by ``--env-file`` must
    exist. Raises EnvFileError for a file that cannot be read or parsed."""
    if not choice.enabled:
        return EnvFileValues()
    path = choice.path or state_dir / ENV_FILE_NAME
    if choice.path is None and not path.exists():
        return EnvFileValues()
    try:
        return EnvFileValues(path=path, values=read_env_file(path))
    except OSError as exc:
        hint = "" if choice.path else " (--no-env-file skips it)"
        flag = "--env-file: " if choice.path else ""
        raise EnvFileError(f"{flag}cannot read {path}: {exc.strerror}{hint}") from None


class ProcessEnv:
    """The gateway process's environment with its env file applied: the file's values
    fill in what the explicit environment does not set (so ``api_key_env`` profiles and
    ``${VAR}``s see them), and a reload (``apply`` again) puts a changed value in place.

    A variable whose environment value equals the file's at the first ``apply`` counts as
    the file's: that is how systemd's ``EnvironmentFile=`` hands it over, and it must
    follow a later edit of the file. ``environ`` is changed in place (``os.environ``)."""

    def __init__(self, environ: MutableMapping[str, str]) -> None:
        self.environ = environ
        self.explicit = dict(environ)  # what the process was started with
        self.applied: dict[str, str] = {}
        self._first = True

    def apply(self, read: EnvFileValues) -> list[str]:
        """Apply what was read; returns the names (never values) whose value changed,
        appeared or disappeared since the last call, sorted."""
        values = {k: v for k, v in read.values.items() if k not in LOOKUP_ONLY}
        if self._first:
            for name, value in values.items():
                if self.explicit.get(name) == value:
                    del self.explicit[name]
                    self.applied[name] = value
            self._first = False
        wanted = {k: v for k, v in values.items() if k not in self.explicit}
        changed = sorted(k for k in wanted.keys() | self.applied.keys()
                         if wanted.get(k) != self.applied.get(k))
        for name in self.applied.keys() - wanted.keys():
            self.environ.pop(name, None)
        self.environ.update(wanted)
        self.applied = wanted
        return changed
