"""Sandboxes for ``exec`` (docs/exec.md "Sandbox"): a command runs inside bubblewrap
(``bwrap.py``) or a Docker container (``docker.py``) instead of on the host, under CPU
time, memory and process limits (``limits.py``). ``config.py`` holds the settings;
:func:`runtime.sandbox.wrap.sandbox_for` picks the backend."""
