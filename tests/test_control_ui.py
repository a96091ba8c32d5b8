"""The control UI in headless Chromium (Debian's ``chromium``, driven by Playwright through
``executable_path``; .ci/run installs it): send a message and see the streamed reply with
its tool step, reload and see the history, start a fresh session, read a transcript, run a
cron job from the page, and a rejected token's message. Screenshots go to
``tests/artifacts/control-ui/`` (or ``$TIDEGATE_ARTIFACTS``)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from playwright.async_api import async_playwright

from gateway.cron_jobs import job_from_spec
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import ROOT, base_config, running_gateway

ARTIFACTS = Path(os.environ.get("TIDEGATE_ARTIFACTS", ROOT / "tests" / "artifacts")) / \
    "control-ui"


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:  # a missing browser is a failure, not a skip
        pytest.fail("chromium is not installed (apt-get install -y chromium; .ci/run does)")
    return path


@pytest.fixture
async def ui(tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    async with FakeOpenAI() as fake:
        fake.latency = 0.2  # the reply streams while the page watches
        async with running_gateway(base_config(tmp_path / "state", fake.base_url)) as gw:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=chromium(),
                                                   args=["--no-sandbox"])
                # a browser zone unlike every job's: times must come out in the job's zone
                page = await browser.new_page(timezone_id="America/New_York")
                yield gw, fake, page
                await browser.close()


async def test_chat_stream_history_tools_new_session_and_transcript(ui):
    gw, fake, page = ui
    base = f"http://127.0.0.1:{gw.port}"
    await page.goto(f"{base}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    fake.script_tool_call("write", {"path": "note.md", "content": "milk"})
    fake.script_text("I noted **milk** for you. <script>alert(1)</script>")
    await page.fill("#t", "remember milk")
    await page.press("#t", "Enter")
    await page.wait_for_selector("#thinking", state="attached")  # the thinking indicator
    bubble = page.locator(".msg.assistant").last
    await bubble.locator("strong", has_text="milk").wait_for()  # markdown, rendered
    assert await page.locator("details.tool summary", has_text="tool write").count() >= 1
    html = await bubble.inner_html()
    assert "<script>" not in html and "&lt;script&gt;" in html  # raw HTML stays text
    await page.screenshot(path=str(ARTIFACTS / "chat.png"))

    await page.reload()
    await page.wait_for_selector(".msg.user >> text=remember milk")
    await page.wait_for_selector(".msg.assistant strong >> text=milk")
    assert await page.locator(".msg time").count() >= 2  # timestamps
    await page.screenshot(path=str(ARTIFACTS / "history.png"))

    key = next(e.session_key for a in gw.agents.values() for e in a.store.entries()
               if ":webchat:" in e.session_key)
    old = gw.agents["main"].store.get(key).session_id
    await page.click("#new")
    await page.wait_for_selector("text=Started a new session.")
    assert gw.agents["main"].store.get(key).session_id != old

    await page.click("#tabs >> text=Sessions")
    await page.click(f"#sessions-list a[data-key='{key}']")
    await page.wait_for_selector("#transcript h3")
    await page.screenshot(path=str(ARTIFACTS / "sessions.png"))


async def test_run_a_cron_job_from_the_page(ui):
    gw, fake, page = ui
    job = await gw.scheduling.cron.add(job_from_spec(
        {"name": "digest", "schedule": {"kind": "every", "interval": 3600},
         "message": "summarise", "session_target": "isolated"},
        now=gw.clock.time(), config=gw.config))
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    await page.click("#tabs >> text=Cron")
    await page.wait_for_selector(f"text={job.id}")
    fake.script_text("Digest: all quiet.")
    await page.click(f"button[data-run='{job.id}']")
    await page.wait_for_selector(".cron-result >> text=Digest: all quiet.")
    runs = await gw.scheduling.cron.runs(job.id, 5)
    assert runs and runs[-1]["manual"] is True and runs[-1]["status"] == "ok"
    await page.screenshot(path=str(ARTIFACTS / "cron.png"))
    await page.click("#tabs >> text=Problems")
    await page.wait_for_selector("#problems-list >> text=no problems")


async def test_a_rejected_token_says_so_and_can_be_entered_again(ui):
    gw, _fake, page = ui
    await page.goto(f"http://127.0.0.1:{gw.port}/#token=not-the-token")
    await page.wait_for_selector("text=The gateway rejected this token")
    await page.screenshot(path=str(ARTIFACTS / "rejected-token.png"))
    await page.fill("#auth-token", gw.token)
    await page.click("#auth-form button")
    await page.wait_for_selector("text=connected")


async def test_cron_next_runs_are_shown_in_the_jobs_zone(ui):
    gw, _fake, page = ui
    tokyo = await gw.scheduling.cron.add(job_from_spec(
        {"name": "morning", "schedule": {"kind": "cron", "expr": "0 7 * * *",
                                         "tz": "Asia/Tokyo"},
         "message": "good morning", "session_target": "isolated"},
        now=gw.clock.time(), config=gw.config))
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    await page.click("#tabs >> text=Cron")
    row = page.locator("#cron-list tr", has_text=tokyo.id)
    await row.wait_for()
    text = await row.inner_text()
    assert "Asia/Tokyo" in text
    assert text.count("07:00 JST") == 3, text  # the next three runs, in Tokyo's wall time
    await page.screenshot(path=str(ARTIFACTS / "cron-zones.png"))
