"""Slack stream pacing (issue 13): N replies streaming at once in one workspace, through the
whole gateway with the real slack-sdk adapter against the fake Slack and a fake model that
writes one word every ``--piece-delay`` s. All replies share one ``TierPacer``
(channels/slack/pacing.py), so the workspace's ``chat.update`` calls stay within Tier 3.

Reported: ``chat.update`` calls and the most of them in any 60-second window (target: at
most 50, Tier 3, however many replies stream), edits per reply, the first visible text
after the model's first token (target <= 1.5 s) and when the last reply was final.
Usage: ``.venv/bin/python bench/slack_pacing_bench.py [--replies 8] [--piece-delay 0.05]``
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

from channels.slack.pacing import METHOD_TIER, PER_MINUTE, WINDOW
from tests.fakes.fake_openai import FakeOpenAI
from tests.fakes.fake_slack import FakeSlack
from tests.helpers import base_config, running_gateway

TARGET_FIRST_TEXT_S = 1.5
ANSWER = " ".join(f"word{i}" for i in range(120)) + "."


async def main(args: argparse.Namespace) -> None:
    users = [f"U0B{i:03d}" for i in range(args.replies)]
    async with FakeOpenAI() as model, FakeSlack() as slack:
        with tempfile.TemporaryDirectory() as tmp:
            section = {"enabled": True, "bot_token": slack.bot_token,
                       "app_token": slack.app_token, "api_base_url": slack.api_url,
                       "dm_policy": "open", "streaming": "partial"}
            cfg = base_config(Path(tmp) / "state", model.base_url,
                              channels={"slack": section})
            async with running_gateway(cfg):
                for _ in users:
                    model.push({"type": "text", "text": ANSWER,
                                "piece_delay": args.piece_delay})
                t0 = time.monotonic()
                for user in users:
                    await slack.push_event(slack.dm("go", user=user))
                final = ANSWER.rstrip(".")
                while sum(1 for s in slack.sent if s["method"] == "chat.update"
                          and final in s["payload"].get("text", "")) < len(users):
                    await asyncio.sleep(0.01)
                    if time.monotonic() - t0 > 300:
                        raise SystemExit("the replies never finished")
                done_s = time.monotonic() - t0
                # the fake stamps calls with the wall clock, the model its first token with
                # the monotonic one
                first_token = time.time() - (time.monotonic() - (model.first_piece_at or t0))
    updates = sorted(s["at"] for s in slack.sent if s["method"] == "chat.update")
    posts = sorted(s["at"] for s in slack.sent if s["method"] == "chat.postMessage")
    bound = PER_MINUTE[METHOD_TIER["chat_update"]]
    in_window = max((sum(1 for u in updates if a <= u < a + WINDOW) for a in updates),
                    default=0)
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"replies streaming at once: {len(users)}, model writes each for "
          f"~{len(ANSWER.split()) * args.piece_delay:.1f} s; all final after {done_s:.1f} s")
    print(f"chat.update calls: {len(updates)} ({len(updates) / len(users):.1f} per reply), "
          f"at most {in_window} in any 60 s (target <= {bound}: "
          f"{'PASS' if in_window <= bound else 'FAIL'})")
    first = posts[0] - first_token if posts else float("nan")
    print(f"first text visible after the model's first token: {first * 1000:.0f} ms "
          f"(target <= {TARGET_FIRST_TEXT_S} s) "
          f"{'PASS' if first <= TARGET_FIRST_TEXT_S else 'FAIL'}; first posts of all replies "
          f"within {statistics.fmean([p - posts[0] for p in posts]):.2f} s on average")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--piece-delay", type=float, default=0.05)
    asyncio.run(main(parser.parse_args()))
