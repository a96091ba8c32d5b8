"""The irreversible per-session timeline (seed 000): one package, one room.

- ``service``: :class:`Timeline`, the API the gateway and the turn loop call
- ``model``: events, the canonical hash chain, errors
- ``store``: the :class:`TimelineStore` Protocol and the SQLite backend
- ``writer``: the batched background writer
- ``verify``: streaming chain verification
- ``export`` / ``replay``: JSONL export, transcript rebuild, human replay
"""

from runtime.timeline.service import *
from runtime.timeline.service import __all__  # noqa: F401
