"""The outcome rule under faults, end to end: one real ``tidegate gateway`` process on a
real PostgreSQL, the fake Telegram, Slack and Discord servers, the OpenAI-compatible
endpoint and the webchat WebSocket, a fake model that can be told to answer 500, 429 or
hang. A seeded plan (:mod:`.load`) sends messages over the five surfaces while a seeded
nemesis (:mod:`.nemesis`) kills the gateway with SIGKILL at random instants (a supervisor
starts it again, as systemd would), stops PostgreSQL for 5 s, cuts the model and
delivers a poison message (its turn kills the gateway, every time). Afterwards
:mod:`.check` verifies from outside (the fakes' chats, ``tidegate sessions outcomes``,
``tidegate channels dead-letters list``, ``status`` and ``/metrics``) that every
accepted message has exactly one outcome, that no chat shows a reply twice and that the
dead letters are exactly the poison message. :mod:`.run` ties it together for
``tests/test_fault_injection_kill9.py`` (a short run) and ``bench/fault_injection.py``.
"""
