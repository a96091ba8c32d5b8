"""Running the gateway's event loop so that the process ends within a bound once the
gateway has stopped.

``asyncio.run`` ends by cancelling every task still running and waiting for all of them,
then for the threads of the default executor, without a limit; the interpreter then joins
those threads again. A channel plugin that swallows its cancellation (``except
BaseException: pass`` around an await) or whose ``open()`` of a file blocks in a thread
(``asyncio.to_thread``) would keep the process alive after SIGTERM forever. :func:`run`
gives the leftovers :data:`EXIT_WAIT` seconds, then logs ``gateway_exit_forced`` naming
what it did not wait for (the ``channel-stop:<name>`` task of a channel whose stop was
left behind, gateway/channels/stopping.py) and ends the process with ``os._exit`` (log
files flushed and closed first).
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

log = structlog.get_logger(__name__)

EXIT_WAIT = 2.0  # s (real time) leftover tasks and threads get once the gateway stopped


def run(main: Coroutine[Any, Any, int], *, wait: float = EXIT_WAIT,
        before_exit: Callable[[], None] = lambda: None) -> int:
    """Run ``main`` on a new event loop and return its exit code (exceptions of ``main``
    propagate, after the same bounded clean-up). When tasks or worker threads are still
    running ``wait`` seconds after cancelling them, ``before_exit()`` is called (close the
    log files) and the process ends at once with ``os._exit(code)``: it never returns."""
    before = set(threading.enumerate())  # not ours (a test's servers): never waited for
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # our own default executor (asyncio.to_thread): loop.shutdown_default_executor joins
    # its threads without a limit, this one is shut down without waiting (_finish)
    executor = ThreadPoolExecutor(thread_name_prefix="tidegate-worker")
    loop.set_default_executor(executor)
    code, error = 1, None
    try:
        code = loop.run_until_complete(main)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the clean-up
        error = exc
    stuck = _finish(loop, executor, wait, before)
    if stuck:
        log.warning("gateway_exit_forced", waiting_on=stuck, wait_s=wait,
                    effect="the process exits without waiting for them")
        before_exit()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if error is None else 1)
    asyncio.set_event_loop(None)
    loop.close()
    if error is not None:
        raise error
    return code


def _task_label(task: asyncio.Task) -> str:
    coro = task.get_coro()
    where = getattr(coro, "__qualname__", None) or type(coro).__name__
    module = getattr(getattr(coro, "cr_code", None), "co_filename", "")
    mod = os.path.splitext(os.path.basename(module))[0] if module else ""
    return f"task {task.get_name()} ({mod + '.' if mod else ''}{where})"


def _finish(loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor, wait: float,
            before: set[threading.Thread]) -> list[str]:
    """Cancel the tasks left on ``loop``, shut its async generators and ``executor`` down
    and join the threads started since ``before``, all within ``wait`` seconds; what is
    still running after that (task and thread labels), ``[]`` when everything ended."""
    deadline = time.monotonic() + wait
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in tasks:
        task.cancel()
    stuck: list[str] = []
    if tasks:
        _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=wait))
        stuck += [_task_label(t) for t in pending]
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: no "exception was never retrieved"
    try:
        loop.run_until_complete(asyncio.wait_for(loop.shutdown_asyncgens(),
                                                 max(0.05, deadline - time.monotonic())))
    except TimeoutError:
        stuck.append("async generators")
    executor.shutdown(wait=False, cancel_futures=True)  # its threads are joined below
    for thread in _live_threads(before):
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck += [f"thread {t.name}" for t in _live_threads(before)]
    return stuck


def _live_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """Non-daemon threads started since ``before`` that are still running (the
    interpreter would join them at exit)."""
    return [t for t in threading.enumerate()
            if t not in before and t.is_alive() and not t.daemon]
