"""The email channel: IMAP IDLE in, SMTP out (adapter.py; registered by plugin.py)."""
