"""A session's working context (DESIGN.md "The path of one message" step 6; seed 003 §5).

- ``messages``: transcript entries <-> model messages (and the transcript message builders);
- ``budget``: token estimates and fitting a history to the model's token budget;
- ``session_log``: ``SessionLog`` (one transcript writer plus its in-memory tail) and ``HeldLog``;
- ``guard``: the context window guard (refuse or warn on a too-small model window).
"""
