"""Store interfaces (DESIGN.md "Storage and scale-out"): every store the gateway keeps sits
behind a small protocol here, with an ``embedded`` backend (files + SQLite, the
zero-config default) and, later, a ``postgres`` backend.

- :mod:`runtime.storage.sessions`: the session store (session key -> entry record).
- :mod:`runtime.storage.transcripts`: session transcripts (OpenClaw-v3 JSONL lines).
"""
