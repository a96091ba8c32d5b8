"""Verified backups of the state dir: ``snapshot`` (what goes in and how it is read while
the gateway runs), ``archive`` (create), ``check`` (verify and restore), ``service`` (the
scheduled backup with rotation and the last result for status, doctor and /metrics).
"""
