"""What a config reload (SIGHUP) can apply live, and what needs a restart."""

from __future__ import annotations

from gateway.config.schema import Config

# Sections bound to sockets, files or connections opened at start.
RESTART_ONLY = (
    ("gateway", "state_dir"), ("gateway", "bind"), ("gateway", "port"), ("logging", None),
    ("channels", None), ("lanes", None), ("timeline", None),
)


def restart_required(old: Config, new: Config) -> list[str]:
    """Dotted names of changed settings that only take effect after a restart."""
    changed: list[str] = []
    for section, key in RESTART_ONLY:
        a, b = getattr(old, section), getattr(new, section)
        if key is not None:
            a, b = getattr(a, key), getattr(b, key)
        if a != b:
            changed.append(f"{section}.{key}" if key else section)
    return changed
