"""runtime/ids.py: unique hex ids without a syscall per id, distinct across a fork."""

import os

from runtime.ids import unique_hex
from runtime.transcript import new_entry_id


def test_shape_and_uniqueness():
    ids = {unique_hex(12) for _ in range(20_000)}
    assert len(ids) == 20_000
    assert all(len(i) == 12 and int(i, 16) >= 0 and i == i.lower() for i in ids)
    assert len(unique_hex(1)) == 1 and len(new_entry_id()) == 8


def test_a_forked_child_does_not_repeat_the_parents_ids():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report the next ids and leave at once
        os.write(w, " ".join(unique_hex(16) for _ in range(4)).encode())
        os._exit(0)
    os.close(w)
    parent = [unique_hex(16) for _ in range(4)]
    child = os.read(r, 200).decode().split()
    os.waitpid(pid, 0)
    os.close(r)
    assert len(child) == 4 and not set(child) & set(parent)
