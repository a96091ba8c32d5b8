"""Ids that must be unique, not secret: transcript entry ids, run ids, completion ids.

``uuid.uuid4()`` and ``secrets.token_hex`` read ``os.urandom`` on every call, a syscall
that also releases the GIL — under load the timeline writer thread takes it mid-turn
(runtime/timeline/service.py measured ~20 µs per call). A turn made five such ids. These
come from one PRNG seeded with OS entropy at import and reseeded in a forked child, so
two processes never share a sequence. Never use them for tokens or anything an attacker
must not guess (``secrets`` is for that).
"""

from __future__ import annotations

import os
import random

_rng = random.Random()
os.register_at_fork(after_in_child=_rng.seed)


def unique_hex(chars: int) -> str:
    """``chars`` random lower-case hex digits (``chars`` > 0)."""
    return f"{_rng.getrandbits(chars * 4):0{chars}x}"
