"""The conformance test every chat channel passes, parametrised over the drivers in
tests/conformance/drivers/ (tests/conformance/driver.py says how to add one).

One fake platform and one gateway per channel for the whole module (tests run in file
order against them): a DM (redelivery answered once), group mention gating, a long reply
split under the limit, media in and out, an outage and reconnect (outbox), then a restart
without loss or double (a message sent while the gateway was down is answered once, the
old one is not answered again) and streaming (or its documented absence) on the
restarted gateway.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from channels import registry
from tests.channel_harness import (
    chat_requests,
    code_line_numbers,
    last_user_text,
    long_reply,
    outbox_files,
    sessions_with,
    until,
)
from tests.conformance.driver import ChannelDriver, drivers
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, base_config, running_gateway

DRIVERS = drivers()
pytestmark = [pytest.mark.timeout(40), pytest.mark.asyncio(loop_scope="module")]
CHART = b"tide chart: high water 06:10, low water 12:40\n"
STREAMED = ("The tide comes in twice a day. It rises for about six hours, then falls "
            "again for six. Spring tides follow the new and the full moon.")


class Run:
    """The module's gateway for one driver; :meth:`restart` stops it and starts a new
    one on the same state directory (optionally with other channel settings)."""

    def __init__(self, driver: ChannelDriver, model: FakeOpenAI, state: Path) -> None:
        self.driver, self.model, self.state = driver, model, state
        self.gw: Any = None
        self._ctx: Any = None

    def config(self, **section: Any) -> dict[str, Any]:
        return base_config(self.state, self.model.base_url,
                           channels={self.driver.name: self.driver.section(**section)},
                           messages={"typing_interval": "0.2s"})

    async def start(self, **section: Any) -> None:
        self._ctx = running_gateway(self.config(**section))
        self.gw = await self._ctx.__aenter__()
        self.driver.attach(self.gw)
        await until(lambda: self.channel_state() == "connected", what="connected")

    async def stop(self) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            await ctx.__aexit__(None, None, None)

    async def restart(self, **section: Any) -> None:
        await self.stop()
        await self.start(**section)

    def channel_state(self) -> str | None:
        return (self.gw.status()["channels"].get(self.driver.name) or {}).get("state")

    def workspace(self) -> Path:
        return self.state / "workspace" / "main"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def model():
    async with FakeOpenAI() as fake:
        yield fake


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=DRIVERS,
                        ids=[d.name for d in DRIVERS])
async def run(request, model, tmp_path_factory):
    driver: ChannelDriver = request.param
    await driver.start()
    r = Run(driver, model, tmp_path_factory.mktemp(driver.name) / "state")
    r.workspace().mkdir(parents=True)
    (r.workspace() / "tide-chart.txt").write_bytes(CHART)
    await r.start()
    try:
        yield r
    finally:
        await r.stop()
        await driver.stop()


def asked(model: FakeOpenAI, since: int) -> list[str]:
    return [last_user_text(b) for b in chat_requests(model)[since:]]


async def reply_after(read: Any, before: int, what: str) -> list[str]:
    return (await until(lambda: read()[before:] or None, what=what))


async def test_a_dm_is_answered_in_the_dm_and_a_redelivery_runs_once(run):
    d, n, seen = run.driver, len(chat_requests(run.model)), len(run.driver.dm_texts())
    handle = await d.dm("conformance hello")
    [reply] = await reply_after(d.dm_texts, seen, "the DM reply")
    assert d.plain(reply) == "echo: conformance hello"
    await d.redeliver(handle)  # as the platform does without an acknowledgement
    await d.dm("conformance sentinel")
    await until(lambda: len(d.dm_texts()) == seen + 2, what="the sentinel reply")
    assert [t.rsplit(" ", 1)[-1] for t in asked(run.model, n)] == ["hello", "sentinel"]
    assert [d.plain(t) for t in d.dm_texts()[seen:]] == ["echo: conformance hello",
                                                         "echo: conformance sentinel"]
    await sessions_with(run.state, d.dm_key)


def doc_page(d: ChannelDriver) -> str:
    return (ROOT / "docs" / "channels" / f"{d.doc_page or d.name}.md").read_text().lower()


async def test_a_group_message_runs_only_when_the_bot_is_mentioned(run):
    if not run.driver.groups:  # the documented absence (email, WhatsApp: no group chats)
        page = doc_page(run.driver)
        assert "no groups" in page or "one-to-one chats only" in page
        return
    d, n, seen = run.driver, len(chat_requests(run.model)), len(run.driver.group_texts())
    await d.group("just chatting among ourselves", mention=False)
    await d.group("what is the tide doing?", mention=True)
    [reply] = await reply_after(d.group_texts, seen, "the group reply")
    assert d.plain(reply).endswith("what is the tide doing?")
    [text] = asked(run.model, n)  # one turn: the unmentioned line is only context
    assert text.endswith("what is the tide doing?")
    await sessions_with(run.state, d.group_key)


async def test_a_long_reply_is_split_under_the_limit_without_loss(run):
    d, seen = run.driver, len(run.driver.dm_texts())
    run.model.script_text(long_reply())
    await d.dm("the whole script please")
    await until(lambda: "That's all." in "".join(d.dm_texts()[seen:]), what="every part")
    parts = d.dm_texts()[seen:]
    assert len(parts) >= 3 if d.splits else len(parts) == 1  # email: one mail, whole
    assert all(d.length(p) <= d.limit for p in parts)
    assert code_line_numbers([d.plain(p) for p in parts]) == list(range(110))


async def test_media_in_reaches_the_model_and_media_out_is_uploaded(run):
    d, n, seen = run.driver, len(chat_requests(run.model)), len(run.driver.dm_uploads())
    run.model.script_text("Here is the chart.\nMEDIA: tide-chart.txt")
    data = b"Low tide at 12:40 on the pier.\n"
    await d.dm_file("what does this note say?", "pier-note.txt", data, "text/plain")
    uploads = await reply_after(d.dm_uploads, seen, "the upload")
    assert uploads == [("tide-chart.txt", CHART)]
    [text] = asked(run.model, n)
    assert "inbox/" in text  # stored in the workspace, referenced in the turn
    stored = [p for p in (run.workspace() / "inbox").glob("*/*") if p.read_bytes() == data]
    assert stored and stored[0].name.startswith(hashlib.sha256(data).hexdigest()[:12])


async def test_an_outage_keeps_the_reply_in_the_outbox_until_reconnect(run):
    d, n, seen = run.driver, len(chat_requests(run.model)), len(run.driver.dm_texts())
    run.model.script_text("the answer survived the outage", delay=0.3)
    await d.dm("a question during an outage")
    await until(lambda: len(chat_requests(run.model)) > n, what="the model call")
    await d.outage(True)
    try:
        [entry] = await until(lambda: outbox_files(run.gw.state_dir), what="outbox entry")
        assert entry["message"]["channel"] == d.name
        await until(lambda: run.channel_state() in ("reconnecting", "failed"),
                    what="the channel to notice the outage")
    finally:
        await d.outage(False)
    [reply] = await reply_after(d.dm_texts, seen, "delivery after reconnect")
    assert d.plain(reply) == "the answer survived the outage"
    await until(lambda: not outbox_files(run.gw.state_dir), what="the outbox to drain")
    assert len(chat_requests(run.model)) == n + 1 and len(d.dm_texts()) == seen + 1


async def test_a_restart_loses_nothing_and_doubles_nothing(run):
    d, seen = run.driver, len(run.driver.dm_texts())
    handle = await d.dm("before the restart")
    await reply_after(d.dm_texts, seen, "the reply before the restart")
    n = len(chat_requests(run.model))
    await run.stop()
    await d.dm("sent while the gateway was down")  # the platform keeps it
    await run.start(streaming={"mode": "partial", "min_interval": "50ms"})
    await until(lambda: len(d.dm_texts()) == seen + 2, what="the reply after the restart")
    await d.redeliver(handle)
    await d.dm("restart sentinel")
    await until(lambda: len(d.dm_texts()) == seen + 3, what="the sentinel reply")
    assert [t.split(" ")[-1] for t in asked(run.model, n)] == ["down", "sentinel"]


async def test_streaming_or_its_documented_absence(run):
    """Runs on the gateway the restart test started with ``streaming: partial``."""
    d, seen, edits = run.driver, len(run.driver.dm_texts()), run.driver.edit_count()
    words = STREAMED.split(" ")
    pieces = [" ".join(words[i:i + 4]) + " " for i in range(0, len(words), 4)]
    pieces[-1] = pieces[-1].rstrip()
    run.model.push({"type": "text", "text": STREAMED, "pieces": pieces, "piece_delay": 0.08})
    await d.dm("tell me about the tide")
    await until(lambda: d.dm_texts()[seen:] and d.plain(d.dm_texts()[-1]) == STREAMED,
                what="the whole streamed reply")
    assert [d.plain(t) for t in d.dm_texts()[seen:]] == [STREAMED]  # one message, whole
    plugin = registry.channel_plugin(d.name)
    if d.streams:
        assert plugin.capabilities.edits or plugin.capabilities.drafts
        assert d.edit_count() > edits, "the reply did not grow while the model wrote"
    else:
        assert d.edit_count() == edits
        assert "no streaming" in doc_page(d)
