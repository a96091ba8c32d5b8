"""``python -m tests.fakes.fake_discord [--port N]``: the fake Discord standalone."""

import argparse
import json
import signal
import threading

from tests.fakes.fake_discord import start_in_thread

parser = argparse.ArgumentParser(description="Run the fake Discord server.")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--token", default="fake-discord-token")
parser.add_argument("--no-privileged-intents", action="store_true")
args = parser.parse_args()
handle = start_in_thread(args.port, token=args.token,
                         privileged_intents=not args.no_privileged_intents)
print(json.dumps({"url": handle.url, "api_url": handle.api_url,
                  "gateway_url": handle.gateway_url}), flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
try:
    stop.wait()
except KeyboardInterrupt:
    pass
handle.stop()
