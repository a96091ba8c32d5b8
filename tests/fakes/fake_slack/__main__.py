"""``python -m tests.fakes.fake_slack``: the fake Slack standalone (see ``main``)."""

from __future__ import annotations

import argparse
import asyncio
import signal

from tests.fakes.fake_slack import FakeSlack


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.fakes.fake_slack [--port N] [--bot-token T] [--app-token T]
    [--signing-secret S] [--redeliver-after SECONDS]``: prints ``READY <url>``, runs until
    SIGTERM/SIGINT."""

    parser = argparse.ArgumentParser(description="Run the fake Slack standalone.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bot-token", default="xoxb-fake-bot-token")
    parser.add_argument("--app-token", default="xapp-fake-app-token")
    parser.add_argument("--signing-secret", default="fake-signing-secret")
    parser.add_argument("--redeliver-after", type=float, default=None,
                        help="redeliver events not acked within this many seconds (off)")
    args = parser.parse_args(argv)

    async def serve() -> None:
        fake = await FakeSlack(host=args.host, port=args.port, bot_token=args.bot_token,
                               app_token=args.app_token,
                               signing_secret=args.signing_secret,
                               redeliver_after=args.redeliver_after).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"READY {fake.url}", flush=True)
        await stop.wait()
        await fake.stop()

    asyncio.run(serve())


main()
