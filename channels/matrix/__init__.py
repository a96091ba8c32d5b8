"""The Matrix channel (matrix-nio against any Matrix homeserver, e.g. Synapse)."""
