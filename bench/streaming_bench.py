"""Streamed replies (issue 13): platform calls per streamed reply and the latency the
gateway adds before the first text is visible, through the whole gateway with the real
python-telegram-bot adapter against the fake Bot API and a fake model that writes slowly
(one word every ``--piece-delay`` seconds).

Target: the first text is visible at most 1.5 s after the model's first token. The calls
per reply are reported against the throttle's bound (one update per ``min_interval``).
Usage: ``.venv/bin/python bench/streaming_bench.py [--replies 5] [--piece-delay 0.05]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_telegram import FakeTelegram
from tests.helpers import base_config, running_gateway

TARGET_FIRST_TEXT_S = 1.5
ANSWER = " ".join(f"word{i}" for i in range(120)) + "."


async def one_reply(model: FakeOpenAI, tg: FakeTelegram, chat: int, piece_delay: float
                    ) -> tuple[float, int]:
    model.first_piece_at = None
    model.push({"type": "text", "text": ANSWER, "piece_delay": piece_delay})
    start = len(tg.sent)
    tg.inject_message("go", chat_id=chat, user_id=chat)
    while not any(s["method"] == "sendMessage" for s in tg.sent[start:]):
        await asyncio.sleep(0.005)
    mine = [s for s in tg.sent[start:] if s["method"] in
            ("sendMessageDraft", "sendMessage", "editMessageText")]
    first_at = mine[0]["time"]  # wall clock of the fake; convert the model's monotonic
    first_token_wall = time.time() - (time.monotonic() - model.first_piece_at)
    return first_at - first_token_wall, len(mine)


async def main(args: argparse.Namespace) -> None:
    async with FakeOpenAI() as model:
        tg = await FakeTelegram().start()
        with tempfile.TemporaryDirectory() as tmp:
            section = {"enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                       "poll_timeout": 1, "dm_policy": "open"}
            cfg = base_config(Path(tmp) / "state", model.base_url,
                              channels={"telegram": section})
            async with running_gateway(cfg):
                results = [await one_reply(model, tg, 1000 + i, args.piece_delay)
                           for i in range(args.replies)]
        await tg.stop()
    latency = [r[0] for r in results]
    calls = [r[1] for r in results]
    writing = len(ANSWER.split()) * args.piece_delay
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"replies: {len(results)}, model writes each for ~{writing:.1f} s")
    print(f"platform calls per streamed reply: median {statistics.median(calls):.0f} "
          f"(drafts + final sendMessage; throttle bound ~{writing + 2:.0f})")
    p50, worst = statistics.median(latency), max(latency)
    verdict = "PASS" if worst <= TARGET_FIRST_TEXT_S else "FAIL"
    print(f"first text visible after the model's first token: p50 {p50 * 1000:.0f} ms, "
          f"max {worst * 1000:.0f} ms (target <= {TARGET_FIRST_TEXT_S} s) {verdict}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=5)
    parser.add_argument("--piece-delay", type=float, default=0.05)
    asyncio.run(main(parser.parse_args()))
