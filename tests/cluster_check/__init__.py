"""A randomized fault checker for gateway replicas, in the spirit of Jepsen.

N real ``tidegate gateway`` replicas on one real PostgreSQL; a generator
(:mod:`.generator`) sends messages to random sessions through random surfaces (the fake
Telegram Bot API, the gateway's OpenAI-compatible endpoint, ``tidegate agent -m``) and
replicas; a nemesis (:mod:`.nemesis`) kills, pauses and restarts replicas, stops
PostgreSQL and slows the model at random moments; the fake model (:mod:`.model`) records
every call. Afterwards :mod:`.checker` verifies the recorded history. :mod:`.run` ties it
together for ``bench/cluster_checker.py`` (long runs) and ``tests/test_cluster_checker.py``
(a short seeded run in the suite).
"""
