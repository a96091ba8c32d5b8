"""The control UI in headless Chromium (Debian's ``chromium``, driven by Playwright through
``executable_path``; .ci/run installs it): send a message and see the streamed reply with
its tool step, reload and see the history, start a fresh session, switch the chat to
another session with the picker, read a transcript, run a cron job from the page, and a
rejected token's message. Screenshots go to ``tests/artifacts/control-ui/`` (or
``$TIDEGATE_ARTIFACTS``)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest
import structlog
from playwright.async_api import async_playwright
from structlog.testing import capture_logs

from gateway.scheduling.cron_jobs import job_from_spec
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
        cfg = base_config(tmp_path / "state", fake.base_url)
        cfg["agents"]["defaults"]["tools"] = {"exec": {  # the approvals view's test
            "security": "allowlist", "ask": "on-miss", "approvers": ["telegram:1001"]}}
        async with running_gateway(cfg) as gw:
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=chromium(),
                                                   args=["--no-sandbox"])
                # a browser zone unlike every job's: times must come out in the job's zone
                page = await browser.new_page(timezone_id="America/New_York")
                yield gw, fake, page
                await browser.close()


async def hourly_job(gw, name: str, message: str):
    """An isolated cron job every hour, added through the gateway's cron service."""
    return await gw.scheduling.cron.add(job_from_spec(
        {"name": name, "schedule": {"kind": "every", "interval": 3600},
         "message": message, "session_target": "isolated"},
        now=gw.clock.time(), config=gw.config))


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

    # "fork from here" and "rewind to here" on a message of a transcript
    await page.click("#tabs >> text=Chat")
    for text, reply in (("first words", "one"), ("second words", "two")):
        fake.script_text(reply)
        await page.fill("#t", text)
        await page.press("#t", "Enter")
        await page.wait_for_selector(f".msg.assistant >> text={reply}")
    before = gw.agents["main"].store.get(key).session_id
    await page.click("#tabs >> text=Sessions")
    await page.click(f"#sessions-list a[data-key='{key}']")
    first = page.locator("#transcript .msg.user", has_text="first words")
    await first.locator("[data-fork]").click()
    await page.wait_for_selector(".fork-result >> text=Forked turn 1 of 2")
    fork = next(e.session_key for e in gw.agents["main"].store.entries()
                if e.session_key.startswith(key + ":fork:"))
    assert transcript_texts(gw, fork) == ["first words", "one"]
    await page.click(f"#sessions-list a[data-key='{key}']")
    await page.locator("#transcript .msg.user", has_text="first words").locator(
        "[data-rewind]").click()
    await page.wait_for_selector(".fork-result >> text=Rewound this session to turn 1 of 2")
    assert gw.agents["main"].store.get(key).session_id != before
    assert transcript_texts(gw, key) == ["first words", "one"]


async def test_run_a_cron_job_from_the_page(ui):
    gw, fake, page = ui
    job = await hourly_job(gw, "digest", "summarise")
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
    # a refused SIGHUP reload (the signal path itself: tests/test_env_file.py) is listed
    gw.reload_report.failed(gw.clock.time(), ["media.album_wait: not a duration"])
    await page.click("#tabs >> text=Cron")
    await page.click("#tabs >> text=Problems")
    item = page.locator("#problems-list li", has_text="still running the previous config")
    await item.wait_for()
    assert "failed: media.album_wait: not a duration" in await item.inner_text()


async def test_usage_channels_and_cron_toggle_and_history_views(ui):
    """The views an operator checks (issue 14 "Views"): usage and cost after a real turn,
    channels with their state and the outbox, a cron job disabled and enabled again from
    the page, and its run history."""
    gw, fake, page = ui
    fake.script_text("hello")
    await gw.local.send("hi")
    job = await hourly_job(gw, "tidy", "tidy up")
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    await page.click("#tabs >> text=Usage")
    await page.wait_for_selector("#usage-list >> text=fake/fake-model")
    await page.screenshot(path=str(ARTIFACTS / "usage.png"))
    await page.click("#tabs >> text=Channels")
    await page.wait_for_selector("#channels-list >> text=webchat")
    await page.wait_for_selector("#channels-list >> text=outbox: 0 pending")
    # a reply the platform refused, and refused again at its first retry: the Channels
    # view shows it on its channel's row, the Problems view names it
    from channels.base import OutboundMessage
    entry = gw.outbox.put(OutboundMessage(channel="telegram", to="42", text="hi"),
                          "Forbidden: bot was blocked by the user")
    gw.outbox.mark_failed(entry, "Forbidden: bot was blocked by the user")
    await page.click("#tabs >> text=Usage")
    await page.click("#tabs >> text=Channels")
    cell = page.locator("#channels-list [data-outbox='telegram'].stuck")
    await cell.wait_for()
    assert (await cell.inner_text()).startswith("1 waiting (oldest ")
    assert (await cell.inner_text()).endswith("s): Forbidden: bot was blocked by the user")
    await page.click("#tabs >> text=Problems")
    await page.wait_for_selector("#problems-list li >> text=1 reply waiting in the outbox "
                                 "for telegram:default")
    await page.screenshot(path=str(ARTIFACTS / "problems-outbox.png"))
    await page.click("#tabs >> text=Cron")
    await page.click(f"button[data-toggle='{job.id}'] >> text=disable")
    await page.wait_for_selector(f"button[data-toggle='{job.id}'] >> text=enable")
    assert not (await gw.scheduling.cron.get(job.id)).enabled
    await page.click(f"button[data-toggle='{job.id}']")
    await page.wait_for_selector(f"button[data-toggle='{job.id}'] >> text=disable")
    fake.script_text("Tidied.")
    await page.click(f"button[data-run='{job.id}']")
    await page.wait_for_selector(".cron-result >> text=Tidied.")
    await page.click(f"button[data-runs='{job.id}']")
    await page.wait_for_selector("#cron-runs td >> text=ok")
    await page.screenshot(path=str(ARTIFACTS / "cron-history.png"))


async def test_each_model_round_gets_its_own_bubble(ui):
    """A round that says something and calls a tool, then the final round: two assistant
    bubbles with the tool step between them, live and after a reload."""
    gw, fake, page = ui
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    fake.script_tool_call("write", {"path": "list.md", "content": "eggs"},
                          text="Let me write that down.")
    fake.script_text("Done: eggs are on the list.")
    await page.fill("#t", "add eggs")
    await page.press("#t", "Enter")
    await page.wait_for_selector(".msg.assistant >> text=Done: eggs are on the list.")
    for _ in range(2):
        texts = await page.locator(".msg.assistant").all_inner_texts()
        assert [t.split("\n")[0] for t in texts][-2:] == [
            "Let me write that down.", "Done: eggs are on the list."], texts
        order = await page.evaluate("""() => [...document.querySelectorAll('#log > *')]
            .map((e) => e.tagName === 'DETAILS' ? 'tool' : e.className)""")
        first = order.index("msg assistant")
        assert "tool" in order[first:order.index("msg assistant", first + 1)]
        await page.reload()
        await page.wait_for_selector(".msg.assistant >> text=Done: eggs are on the list.")
    await page.screenshot(path=str(ARTIFACTS / "rounds.png"))


async def test_a_silent_reply_leaves_no_bubble_live_or_after_a_reload(ui):
    """``NO_REPLY`` (README "Silent replies"): no bubble, even for a note streamed before a
    trailing token; a mid-sentence token is removed; the transcript keeps all raw."""
    gw, fake, page = ui
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    for reply in ("NO_REPLY", "Noted, nothing to add.\n\nNO_REPLY", "pong NO_REPLY here"):
        fake.script_text(reply)
        await page.fill("#t", f"say {len(reply)}")
        await page.press("#t", "Enter")
    for _ in range(2):
        await page.wait_for_selector(".msg.assistant >> text=pong here")
        texts = await page.locator(".msg.assistant").all_inner_texts()
        assert [t.split("\n")[0] for t in texts] == ["pong here"], texts
        assert "NO_REPLY" not in await page.locator("#log").inner_text()
        assert await page.locator(".msg.user").count() == 3
        await page.reload()
    key = next(e.session_key for e in gw.agents["main"].store.entries()
               if ":webchat:" in e.session_key)
    assert transcript_texts(gw, key)[1::2] == [
        "NO_REPLY", "Noted, nothing to add.\n\nNO_REPLY", "pong NO_REPLY here"]


def transcript_texts(gw, key: str) -> list[str]:
    """The user and assistant texts of ``key``'s transcript, read back from disk."""
    from gateway.sessions.history import session_history
    return [m["text"] for m in session_history(gw, key) if m["role"] in ("user", "assistant")]


async def test_the_chat_session_picker_switches_the_session_the_chat_talks_to(ui):
    """The header's session picker (issue 14 "Chat"): it lists this agent's webchat
    sessions (not other channels' sessions, which open in the Sessions view), and picking
    one makes the chat talk to it: its history is shown, the next message goes to it (the
    model sees that session's history; the transcript on disk gets it), and a reload stays
    on it."""
    gw, fake, page = ui
    fake.script_text("Your tea is ready.")
    other = (await gw.local.send("make tea", to="web-other", channel="webchat")).session_key
    fake.script_tool_call("write", {"path": "tea.md", "content": "green"})
    fake.script_text("Alice, your tea is ready.")
    alice = (await gw.local.send("make tea for alice", to="alice")).session_key  # a CLI one
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    fake.script_text("Hello from the web.")
    await page.fill("#t", "hi from the page")
    await page.press("#t", "Enter")
    await page.wait_for_selector(".msg.assistant >> text=Hello from the web.")
    mine = next(e.session_key for e in gw.agents["main"].store.entries()
                if ":webchat:" in e.session_key and e.session_key != other)
    picker = page.locator("#picker")
    await page.wait_for_selector(f"#picker option[value='{other}']", state="attached")
    options = await picker.locator("option").evaluate_all("os => os.map(o => o.value)")
    assert mine in options and other in options and alice not in options, options
    assert await picker.input_value() == mine  # this page's session is the one selected

    await picker.select_option(other)
    await page.wait_for_selector("#chat.on")  # the chat stays: it now talks to `other`
    await page.wait_for_selector("#log .msg.user >> text=make tea")
    await page.wait_for_selector("#log .msg.assistant >> text=Your tea is ready.")
    assert "hi from the page" not in await page.locator("#log").inner_text()
    assert await picker.input_value() == other
    fake.script_text("A second cup, coming up.")
    await page.fill("#t", "a second cup please")
    await page.press("#t", "Enter")
    await page.wait_for_selector("#log .msg.assistant >> text=A second cup, coming up.")
    seen = [m["content"] for m in fake.requests[-1].json["messages"] if m["role"] == "user"]
    assert "make tea" in seen and "hi from the page" not in seen, seen
    assert transcript_texts(gw, other)[-2:] == ["a second cup please",
                                                "A second cup, coming up."]
    assert "a second cup please" not in transcript_texts(gw, mine)
    await page.screenshot(path=str(ARTIFACTS / "session-picker.png"))

    await page.reload()  # the pick is remembered
    await page.wait_for_selector("#log .msg.user >> text=a second cup please")
    assert await picker.input_value() == other

    # other channels' sessions open read-only in the Sessions view, with their tool calls
    await page.click("#tabs >> text=Sessions")
    await page.click(f"#sessions-list a[data-key='{alice}']")
    await page.wait_for_selector(f"#transcript h3 >> text={alice}")
    await page.wait_for_selector("#transcript .msg.assistant >> text=Alice, your tea is ready.")
    await page.wait_for_selector("#transcript code >> text=write")  # the call and its args
    await page.wait_for_selector("#transcript em >> text=tool write")  # and its result


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


async def test_sessions_view_shows_each_sessions_timeline_verify_status(ui):
    import sqlite3
    gw, fake, page = ui
    fake.script_text("fine")
    fake.script_text("also fine")
    good = (await gw.local.send("hello", to="alice")).session_key
    bad = (await gw.local.send("hello", to="mallory")).session_key
    bad_id = gw.agents["main"].store.get(bad).session_id
    for key in (good, bad):
        await gw.timeline_hooks.settled(gw.agents["main"].store.get(key).session_id)
    await gw.timeline_hooks.timeline.store.flush()  # commit the pending log before editing
    conn = sqlite3.connect(gw.state_dir / "timeline.db", isolation_level=None)
    conn.execute("DROP TRIGGER timeline_events_no_update")  # as an attacker could
    conn.execute("UPDATE timeline_events SET content = replace(content, 'hello', 'HELLO') "
                 "WHERE session_id = ? AND event_type = 'USER_INPUT'", (bad_id,))
    conn.close()
    # an earlier test in this worker may have left an INFO filter (a CLI run's logging
    # set-up) that drops the DEBUG lines asserted below before capture_logs() sees them
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    with capture_logs() as logs:
        await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
        await page.wait_for_selector("text=connected")
        await page.click("#tabs >> text=Sessions")
        ok_cell = page.locator(f"#sessions-list [data-verify='{good}']")
        bad_cell = page.locator(f"#sessions-list [data-verify='{bad}']")
        await page.wait_for_selector(f"#sessions-list [data-verify='{bad}'][data-status]")
        await page.wait_for_selector(f"#sessions-list [data-verify='{good}'][data-status]")
    # a page load is no INFO line per session: a chain that recomputes is DEBUG, the
    # broken one is one warning (the page asks more than once: the repeats are DEBUG)
    verified = [(e["log_level"], e["session_id"]) for e in logs
                if e["event"] == "timeline_verified"]
    assert verified and {lvl for lvl, _ in verified} == {"debug"}, verified
    failed = [(e["log_level"], e["session_id"]) for e in logs
              if e["event"] == "timeline_verify_failed"]
    assert failed[0] == ("warning", bad_id) and set(failed[1:]) <= {("debug", bad_id)}
    assert not [e for e in logs if e["log_level"] == "info"
                and str(e["event"]).startswith("timeline")]
    assert (await ok_cell.inner_text()).startswith("✓ verified (")
    text = await bad_cell.inner_text()
    assert text.startswith("✗ broken at seq ") and "hash mismatch" in text, text
    await page.screenshot(path=str(ARTIFACTS / "sessions-verify.png"))


@pytest.fixture
async def ui_logs(tmp_path):
    """A gateway with a Telegram channel (the fake platform) whose structured log goes to
    its state dir through the real logging pipeline, and a page on its control UI."""
    import io

    from gateway.logs.pipeline import configure_logging, reset_logging
    from tests.fakes.fake_telegram import FakeTelegram
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    state = tmp_path / "state"
    configure_logging(state_dir=state, level="info", fmt="json", stream=io.StringIO())
    tg = await FakeTelegram().start()
    try:
        async with FakeOpenAI() as fake:
            cfg = base_config(state, fake.base_url, channels={"telegram": {
                "enabled": True, "token": tg.token, "api_base_url": f"{tg.url}/bot",
                "poll_timeout": 1, "dm_policy": "open"}})
            async with running_gateway(cfg) as gw, async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=chromium(),
                                                   args=["--no-sandbox"])
                page = await browser.new_page()
                yield gw, fake, tg, page
                await browser.close()
    finally:
        await tg.stop()
        reset_logging()


async def log_rows(page) -> list[dict]:
    return await page.eval_on_selector_all(
        "#log-lines div", "els => els.map(e => ({event: e.dataset.event, session: "
        "e.dataset.session, channel: e.dataset.channel, cls: e.className}))")


async def test_logs_view_tails_the_log_live_with_filters(ui_logs):
    import structlog
    gw, fake, tg, page = ui_logs
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    await page.click("#tabs >> text=Logs")
    await page.wait_for_selector("#log-lines div[data-event='gateway_ready']")  # the tail

    key = "agent:main:telegram:dm:4242"
    await page.fill("#lf-session", key)
    await page.click("#log-filters button")
    await page.wait_for_selector("#log-state >> text=live")
    fake.script_text("hello from the model")
    tg.inject_message("hi there", chat_id=4242, user_id=4242)  # after the page connected
    await page.wait_for_selector("#log-lines div[data-event='turn_done']", timeout=20000)
    rows = await log_rows(page)
    assert rows and all(r["session"] == key for r in rows), rows
    await page.screenshot(path=str(ARTIFACTS / "logs-session.png"))

    await page.fill("#lf-session", "")
    await page.fill("#lf-event", "inbound_")
    await page.fill("#lf-channel", "telegram")
    await page.click("#log-filters button")
    await page.wait_for_selector("#log-lines div[data-event='inbound_queued']")  # the tail
    fake.script_text("second answer")
    tg.inject_message("again", chat_id=777, user_id=777)
    await page.wait_for_selector("#log-lines div[data-session='agent:main:telegram:dm:777']"
                                 "[data-event='inbound_queued']", timeout=20000)
    rows = await log_rows(page)
    assert all(r["event"].startswith("inbound_") and r["channel"] == "telegram"
               for r in rows), rows

    await page.fill("#lf-event", "")
    await page.fill("#lf-channel", "")
    await page.select_option("#lf-level", "warning")
    await page.click("#log-filters button")
    await page.wait_for_selector("#log-state >> text=live")
    structlog.get_logger("tests").info("operator_test_info")  # before: read first
    structlog.get_logger("tests").warning("operator_test_warning", detail="shown live")
    await page.wait_for_selector("#log-lines div[data-event='operator_test_warning']")
    rows = await log_rows(page)
    assert all(r["cls"] in ("lv-warning", "lv-error", "lv-critical") for r in rows), rows
    assert not [r for r in rows if r["event"] == "operator_test_info"]
    await page.screenshot(path=str(ARTIFACTS / "logs-level.png"))


async def test_the_page_fits_a_phone_screen(ui):
    """At 390 px (a phone) the header wraps: no view scrolls the page sideways and every
    header control stays on screen."""
    gw, _fake, page = ui
    await page.set_viewport_size({"width": 390, "height": 844})
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    for view in ("Chat", "Sessions", "Cron", "Channels", "Usage", "Logs", "Problems"):
        await page.click(f"#tabs >> text={view}")
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (view, width)
        right = await page.eval_on_selector_all(
            "header *", "els => Math.max(...els.map(e => e.getBoundingClientRect().right))")
        assert right <= 390, (view, right)
    await page.click("#tabs >> text=Chat")
    await page.screenshot(path=str(ARTIFACTS / "phone.png"))


async def test_no_other_origin_can_frame_the_control_ui(ui):
    """Every response says ``frame-ancestors 'none'`` / ``X-Frame-Options: DENY``, and
    Chromium refuses to show the page inside an iframe of another local origin (a page
    that could otherwise trick the operator's clicks), while the page itself still runs."""
    from aiohttp import web
    gw, _fake, page = ui
    base = f"http://127.0.0.1:{gw.port}"
    for path in ("/", "/healthz", "/api/sessions"):
        resp = await page.request.get(base + path)
        policy = [d.strip() for d in resp.headers["content-security-policy"].split(";")]
        assert "frame-ancestors 'none'" in policy, (path, policy)
        assert resp.headers["x-frame-options"] == "DENY", path

    async def framer(_request):
        return web.Response(content_type="text/html", text=(
            f"<h1>evil</h1><iframe id='f' src='{base}/#token={gw.token}' width=600 "
            "height=400></iframe>"))
    app = web.Application()
    app.router.add_get("/", framer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = site._server.sockets[0].getsockname()[1]
        await page.goto(f"http://localhost:{port}/")
        await page.wait_for_selector("h1")  # goto waited for "load": the iframe's too
        inner = [f for f in page.frames if f is not page.main_frame]
        assert len(inner) == 1
        assert not inner[0].url.startswith(base), inner[0].url  # an error page instead
        assert await inner[0].query_selector("#tabs") is None
        await page.screenshot(path=str(ARTIFACTS / "framed.png"))
    finally:
        await runner.cleanup()
    await page.goto(f"{base}/#token={gw.token}")  # on its own, the page works
    await page.wait_for_selector("text=connected")


async def test_an_exec_approval_answered_from_the_approvals_view(ui):
    """A command outside the allowlist waits; the Approvals view lists it with why it
    asks, and its deny button answers it: the model gets the plain result."""
    import asyncio
    gw, fake, page = ui
    fake.script_tool_call("exec", {"command": "rm -rf build"})
    fake.script_text("left it alone")
    turn = asyncio.create_task(gw.local.send("clean up", session_key="agent:main:cli:dm:ui"))
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    while not gw.approvals.store.pending():
        await asyncio.sleep(0.02)
    await page.click("#tabs button[data-view=approvals]")
    await page.wait_for_selector("#approvals-list >> text=rm -rf build")
    assert await page.is_visible("#approvals-list >> text=not in the allowlist")
    await page.screenshot(path=str(ARTIFACTS / "approvals.png"))
    await page.click("#approvals-list button[data-deny]")
    assert (await asyncio.wait_for(turn, 10)).text == "left it alone"
    await page.wait_for_selector("#approvals-recent >> text=operator:api")
    tool = [m for m in fake.requests[-1].json["messages"] if m["role"] == "tool"][-1]
    assert tool["content"] == "denied by operator:api: the command did not run"


async def test_the_approvals_view_shows_invisible_and_blank_looking_characters_escaped(ui):
    """A command hiding text behind a right-to-left override, zero-width and bidi
    isolates, Hangul fillers and a blank Braille pattern: the Approvals view shows the
    escapes the chat prompts show (the same function, server-side), pending and decided,
    and none of the raw characters reaches the page."""
    import asyncio

    from gateway.approvals.prompts import visible
    gw, fake, page = ui
    raw = ["\u202e", "\u202c", "\u2066", "\u2069", "\u200b", "\u200e", "\u200f", "\u3164",
           "\u2800", "\u115f", "\u1160", "\uffa0"]
    command = ("rm -f \u202eelif_efas.txt\u202c \u2066x\u2069\u200b \u200e\u200f "
               "\u3164 \u2800 \u115f\u1160 \uffa0 end")
    fake.script_tool_call("exec", {"command": command})
    fake.script_text("left it alone")
    turn = asyncio.create_task(gw.local.send("go", session_key="agent:main:cli:dm:esc"))
    await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
    await page.wait_for_selector("text=connected")
    while not gw.approvals.store.pending():
        await asyncio.sleep(0.02)
    await page.click("#tabs button[data-view=approvals]")
    code = page.locator("#approvals-list code")
    await code.wait_for()
    shown = await code.inner_text()
    assert shown == visible(command)
    assert "rm -f \\u202eelif_efas.txt\\u202c \\u2066x\\u2069\\u200b \\u200e\\u200f \\u3164 " \
        "\\u2800 \\u115f\\u1160 \\uffa0 end" == shown
    listed = await page.inner_text("#approvals-list")
    assert not [c for c in raw if c in listed]
    assert "shown escaped" in listed
    await page.screenshot(path=str(ARTIFACTS / "approvals-escaped.png"))
    await page.click("#approvals-list button[data-deny]")
    assert (await asyncio.wait_for(turn, 10)).text == "left it alone"
    await page.wait_for_selector("#approvals-recent >> text=operator:api")
    recent = await page.inner_text("#approvals-recent")
    assert shown in recent and not [c for c in raw if c in recent]


async def test_dead_letters_are_listed_resubmitted_and_dropped_from_the_problems_view(tmp_path):
    """Two messages the gateway died on 3 times are set aside at start; the Problems view
    lists them with their crashes, resubmit runs one again (the model sees it) and drop
    removes the other."""
    import asyncio

    from gateway.journal.store import FILE_NAME, IntakeJournal
    from runtime.clock import SYSTEM_CLOCK
    from tests.test_outcomes import crashed
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    state = tmp_path / "state"
    journal = IntakeJournal(state / FILE_NAME, SYSTEM_CLOCK)
    journal.load()
    again = crashed(journal, "agent:main:telegram:dm:7", 7, "poison-again", [["exec"]] * 3)
    gone = crashed(journal, "agent:main:telegram:dm:8", 8, "poison-gone", [["exec"]] * 3)
    journal.close()
    async with FakeOpenAI() as fake, running_gateway(base_config(state, fake.base_url)) as gw:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{gw.port}/#token={gw.token}")
            await page.wait_for_selector("text=connected")
            await page.click("#tabs button[data-view=problems]")
            await page.wait_for_selector("#dead-letters >> text=poison-gone")
            assert await page.is_visible("#dead-letters >> text=tool:exec, tool:exec, tool:exec")
            await page.screenshot(path=str(ARTIFACTS / "dead-letters.png"))
            await page.click(f"#dead-letters button[data-resubmit='{again}']")
            await page.wait_for_selector("#dead-letters >> text=poison-again", state="detached")
            await page.click(f"#dead-letters button[data-drop='{gone}']")
            await page.wait_for_selector("#dead-letters >> text=no dead letters")
            for _ in range(500):  # the resubmitted message reaches the model once
                if any("poison-again" in json_text(r) for r in fake.requests):
                    break
                await asyncio.sleep(0.02)
            assert sum("poison-again" in json_text(r) for r in fake.requests) == 1
            assert not any("poison-gone" in json_text(r) for r in fake.requests)
            assert gw.status()["outcomes"]["dead_letters"] == 0
            await browser.close()


def json_text(request) -> str:
    import json
    return json.dumps((request.json or {}).get("messages", []))
