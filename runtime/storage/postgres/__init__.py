"""The PostgreSQL backend (issue 15): one database for every store, reached through an
asyncpg pool.

- ``errors``: :class:`StorageStartError` and its kinds (no asyncpg import)
- ``pool``: opening the pool (connect + migrate), DSN redaction
- ``migrate``: versioned schema migrations (``migrations/NNNN_name.sql``) applied under an
  advisory lock, and their status
"""
