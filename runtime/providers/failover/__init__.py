"""Failover (seed 001 §2.3-§2.5): error classes (``errors``), auth-profile key sources
(``credentials``), persisted per-profile state (``state``), rotation order and status
(``profiles``) and the try-classify-decide loop over models and profiles (``chain``).

Import from the modules: this package file stays empty so that ``runtime.providers.base``
can use ``errors`` without an import circle.
"""
