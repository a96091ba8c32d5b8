"""Embedded (zero-config) backends: files and SQLite under the state dir."""
