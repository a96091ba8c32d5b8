"""The daemon's GC policy (gateway/service/gc_policy.py): start-up objects frozen, young
threshold raised. Run in a child interpreter so the test process keeps its own GC."""

import json
import subprocess
import sys

from gateway.service.gc_policy import YOUNG_THRESHOLD

CHILD = """
import gc, json
from gateway.service.gc_policy import apply_gc_policy
before = gc.get_threshold()
out = apply_gc_policy()
print(json.dumps({"before": before, "after": gc.get_threshold(),
                  "frozen": gc.get_freeze_count(), "reported": out}))
"""


def test_policy_freezes_startup_objects_and_raises_young_threshold():
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                       check=True, timeout=60)
    got = json.loads(r.stdout)
    assert got["before"][0] < YOUNG_THRESHOLD  # CPython's default
    assert got["after"] == [YOUNG_THRESHOLD, got["before"][1], got["before"][2]]
    assert got["frozen"] > 1000  # the imported modules' objects
    assert got["reported"] == {"threshold": got["after"]}
