"""Structured logging (gateway/logs/pipeline.py) and the log reader (gateway/logs/reader.py, records.py).

Assertions are on the bytes written to gateway.jsonl / the stderr stream and on what the
reader prints.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import structlog

from gateway.logs.pipeline import (
    REDACTED,
    Redactor,
    close_logging,
    configure_logging,
    find_secrets,
    format_ts,
    get_logger,
    log_file_path,
    reset_logging,
    update_secrets,
)
from gateway.logs.reader import read_logs
from gateway.logs.records import format_record
from runtime.clock import parse_iso, utc_iso

SECRET = "s3cr3t-config-value-42"
BOT_TOKEN = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsawQ"
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


class TTYStream(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    structlog.contextvars.clear_contextvars()
    reset_logging()


def _lines(path: Path) -> list[dict]:
    raw = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in raw]


def _log_path(state: Path) -> Path:
    return state / "logs" / "gateway.jsonl"


# --- file format --------------------------------------------------------------------------

def test_every_line_is_json_with_ts_level_event(tmp_path):
    stream = io.StringIO()
    configure_logging(state_dir=tmp_path, stream=stream)
    log = get_logger("gateway.test")
    before = time.time()
    log.info("turn_start", model="gpt-4o", tokens=12)
    log.warning("slow_turn", elapsed_ms=1234.5, text="multi\nline \"quoted\" 中文")
    log.error("delivery_failed", err=ValueError("boom"), path=Path("/x/y"))
    logging.getLogger("telegram.ext").error("Network error: %s", "retrying")
    close_logging()

    path = _log_path(tmp_path)
    assert log_file_path() is None and path.exists()
    records = _lines(path)
    assert [r["event"] for r in records] == ["turn_start", "slow_turn", "delivery_failed",
                                             "Network error: retrying"]
    assert [r["level"] for r in records] == ["info", "warning", "error", "error"]
    for r in records:
        assert list(r)[:3] == ["ts", "level", "event"]
        assert TS_RE.match(r["ts"]), r["ts"]
        assert before - 1 <= parse_iso(r["ts"]) <= time.time() + 1
    assert records[0]["tokens"] == 12 and records[0]["logger"] == "gateway.test"
    assert records[1]["text"] == "multi\nline \"quoted\" 中文"
    assert records[2]["err"] == "ValueError: boom" and records[2]["path"] == "/x/y"
    assert records[3]["logger"] == "telegram.ext"
    # non-TTY stream gets the same JSON lines
    assert [json.loads(x)["event"] for x in stream.getvalue().splitlines()] == \
        [r["event"] for r in records]


def test_our_events_are_written_without_stdlib_records(tmp_path):
    """Our events skip stdlib logging (one render, no LogRecord: gateway/logs/sink.py);
    library records still go through it, into the same file, in order."""
    records: list[logging.LogRecord] = []
    configure_logging(state_dir=tmp_path, stream=io.StringIO())
    counter = logging.Filter()
    counter.filter = lambda record: records.append(record) or True  # type: ignore[method-assign]
    for handler in logging.getLogger().handlers:
        handler.addFilter(counter)
    get_logger("gateway.test").info("ours", n=1)
    logging.getLogger("aiohttp.access").warning("theirs %d", 2)
    get_logger("gateway.test").info("ours_again")
    close_logging()
    assert [r["event"] for r in _lines(_log_path(tmp_path))] == \
        ["ours", "theirs 2", "ours_again"]
    assert {r.name for r in records} == {"aiohttp.access"}


def test_format_ts_matches_clock_utc_iso():
    for epoch in (0.0, 1_767_225_600.0, 1_767_225_600.9996, 1_767_225_601.0011, 1.5e9 + 0.25):
        assert format_ts(epoch) == utc_iso(epoch)


def test_bound_context_reaches_our_and_library_lines(tmp_path):
    configure_logging(state_dir=tmp_path, stream=io.StringIO())
    log = structlog.get_logger("gateway.daemon")
    ctx = {"session_key": "agent:main:telegram:dm:42", "run_id": "r-1",
           "channel": "telegram", "agent": "main", "job_id": "job-7"}
    with structlog.contextvars.bound_contextvars(**ctx):
        log.info("turn_end")
        logging.getLogger("discord.gateway").warning("shard reconnecting")
    log.info("outside")
    close_logging()
    inside_ours, inside_lib, outside = _lines(_log_path(tmp_path))
    for rec in (inside_ours, inside_lib):
        assert {k: rec[k] for k in ctx} == ctx
    assert not set(ctx) & set(outside)


# --- redaction ----------------------------------------------------------------------------

class _Leaky:
    def __repr__(self) -> str:
        return f"<Leaky key={SECRET}>"


def test_secrets_and_tokens_never_reach_file_or_stream(tmp_path):
    stream = io.StringIO()
    configure_logging(state_dir=tmp_path, stream=stream, secrets=[SECRET, BOT_TOKEN, "", "abc"])
    log = get_logger("gateway.test")
    late = "late-added-secret-xyz"
    log.info(f"direct {SECRET}", value=SECRET, token=BOT_TOKEN)
    log.info("nested", cfg={"telegram": {"token": BOT_TOKEN, "list": [SECRET, (SECRET,)]},
                            SECRET: "as a key"}, obj=_Leaky())
    try:
        raise RuntimeError(f"call failed with token {BOT_TOKEN}")
    except RuntimeError:
        log.exception("provider_error")
    logging.getLogger("httpx").warning(
        f"HTTP Request: POST https://telegram.invalid/bot{BOT_TOKEN}/getUpdates \"200 OK\"")
    try:
        {}["x"]
    except KeyError:
        logging.getLogger("slack_sdk").exception("failed with %s", SECRET)
    update_secrets([late])
    log.warning("reloaded", new=late)
    close_logging()

    written = _log_path(tmp_path).read_text(encoding="utf-8") + stream.getvalue()
    for needle in (SECRET, BOT_TOKEN, BOT_TOKEN.split(":")[1], late):
        assert needle not in written
    records = _lines(_log_path(tmp_path))
    assert records[0]["event"] == "direct ***" and records[0]["value"] == "***"
    assert records[1]["cfg"]["telegram"]["list"] == ["***", ["***"]]
    assert records[1]["cfg"]["***"] == "as a key"
    assert records[1]["obj"] == "<Leaky key=***>"
    assert "Traceback" in records[2]["exception"] and "token ***" in records[2]["exception"]
    assert "/bot***/getUpdates" in records[3]["event"]
    assert "KeyError" in records[4]["exception"] and records[4]["event"] == "failed with ***"
    assert records[5]["new"] == "***"
    # "abc" is too short to be treated as a secret
    assert "abc" in Redactor({"abc"}).redact("abc def")


@pytest.mark.parametrize("text, expected", [
    ("key sk-proj-abcdefghijklmnopqrstuv1234", "key ***"),
    ("sk-ant-api03-abcdefghijklmnopqrstuvwxyz", "***"),
    ("slack xoxb-1234567890-0987654321-AbCdEfGh ok", "slack *** ok"),
    ("app xapp-1-A0123-4567-abcdef", "app ***"),
    ("GET /bot7777777:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA/getMe", "GET /bot***/getMe"),
    ("headers={'Authorization': 'Bot MTIz.abc.def'}", "headers={'Authorization': 'Bot ***'}"),
    ("authorization: Bearer eyJhbGciOi.J9.x", "authorization: Bearer ***"),
    ("sent with bearer abcdef123456", "sent with bearer ***"),
    ("https://x.test/v1?api_key=abc123&model=m", "https://x.test/v1?api_key=***&model=m"),
    ("https://x.test/?access_token=zz9#frag", "https://x.test/?access_token=***#frag"),
    ("MTIzNDU2Nzg5MDEyMzQ1Njc4OTA.GaBcDe.abcdefghijklmnopqrstuvwxyz0123", "***"),
])
def test_token_shapes_are_redacted(text, expected):
    assert Redactor().redact(text) == expected


@pytest.mark.parametrize("text", [
    "task-queue-manager-0123456789abcdef",    # "sk-" inside a word
    "session_key=agent:main:telegram:dm:42",  # key= preceded by a word character
    "2026-01-01T00:00:00.000Z turn_end",
    "disk-usage ok",
    "abcd",
])
def test_ordinary_text_is_left_alone(text):
    assert Redactor({"another-secret"}).redact(text) == text


# --- levels, formats, idempotence ---------------------------------------------------------

class _Counted:
    calls = 0

    def __repr__(self) -> str:
        type(self).calls += 1
        return "counted"


def test_below_level_is_dropped_before_processing(tmp_path):
    configure_logging(state_dir=tmp_path, level="info", stream=io.StringIO())
    log = get_logger("gateway.test")
    _Counted.calls = 0
    log.debug("noise", v=_Counted())
    logging.getLogger("httpx").info("HTTP Request: GET https://x/")  # library floor: WARNING
    log.info("kept")
    assert _Counted.calls == 0
    configure_logging(state_dir=tmp_path, level="DEBUG", stream=io.StringIO())
    log.debug("now_visible", v=_Counted())  # the same module-level logger sees the new level
    close_logging()
    events = [r["event"] for r in _lines(_log_path(tmp_path))]
    assert events == ["kept", "now_visible"]
    assert _Counted.calls == 1


def test_rotation_keeps_backups_and_whole_lines(tmp_path):
    configure_logging(state_dir=tmp_path, stream=io.StringIO(), max_bytes=2000, backups=2)
    log = get_logger("gateway.test")
    for i in range(200):
        log.info("tick", i=i, pad="x" * 40)
    close_logging()
    logs = tmp_path / "logs"
    names = sorted(p.name for p in logs.iterdir())
    assert names == ["gateway.jsonl", "gateway.jsonl.1", "gateway.jsonl.2"]
    seen = []
    for name in ("gateway.jsonl.2", "gateway.jsonl.1", "gateway.jsonl"):
        assert (logs / name).stat().st_size <= 2000
        seen += [r["i"] for r in _lines(logs / name)]
    assert seen == list(range(200))[-len(seen):]  # newest lines kept, in order, none torn
    assert oct((logs).stat().st_mode & 0o777) == oct(0o700)


def test_console_vs_json_selection(tmp_path):
    tty = TTYStream()
    configure_logging(state_dir=tmp_path, stream=tty)  # auto + TTY: console with colour
    get_logger("t").info("hello_console", user="bob")
    out = tty.getvalue()
    assert "hello_console" in out and "\x1b[" in out and not out.lstrip().startswith("{")

    plain = io.StringIO()
    configure_logging(state_dir=tmp_path, stream=plain, fmt="console")  # forced, no colour
    get_logger("t").info("hello_plain", user="bob")
    assert "hello_plain" in plain.getvalue() and "user=bob" in plain.getvalue()
    assert "\x1b[" not in plain.getvalue()

    tty_json = TTYStream()
    configure_logging(state_dir=tmp_path, stream=tty_json, fmt="json")
    get_logger("t").info("hello_json")
    assert json.loads(tty_json.getvalue())["event"] == "hello_json"
    close_logging()
    # the file is JSON whatever the stream gets
    assert [r["event"] for r in _lines(_log_path(tmp_path))] == \
        ["hello_console", "hello_plain", "hello_json"]


def test_configure_twice_does_not_duplicate_lines(tmp_path):
    for _ in range(3):
        configure_logging(state_dir=tmp_path, stream=io.StringIO())
    ours = [h for h in logging.getLogger().handlers
            if isinstance(h, (logging.FileHandler, logging.StreamHandler))
            and type(h).__module__ in ("gateway.logs.pipeline", "logging")]
    get_logger("t").info("once")
    logging.getLogger("aiohttp.web").error("lib once")
    close_logging()
    assert [r["event"] for r in _lines(_log_path(tmp_path))] == ["once", "lib once"]
    assert len(ours) >= 2


def test_close_logging_keeps_stderr_and_stops_file(tmp_path):
    stream = io.StringIO()
    configure_logging(state_dir=tmp_path, stream=stream, secrets=[SECRET])
    get_logger("t").info("before")
    close_logging()
    get_logger("t").warning("after", s=SECRET)
    assert [r["event"] for r in _lines(_log_path(tmp_path))] == ["before"]
    last = json.loads(stream.getvalue().splitlines()[-1])
    assert last["event"] == "after" and last["s"] == "***"


@pytest.mark.parametrize("kwargs", [{"level": "verbose"}, {"fmt": "xml"},
                                    {"max_bytes": -1}])
def test_bad_settings_raise_clear_errors(tmp_path, kwargs):
    with pytest.raises(ValueError, match="must"):
        configure_logging(state_dir=tmp_path, stream=io.StringIO(), **kwargs)


def test_stderr_only_without_state_dir(tmp_path):
    stream = io.StringIO()
    configure_logging(state_dir=None, stream=stream)
    get_logger("t").info("no_file")
    assert json.loads(stream.getvalue())["event"] == "no_file"
    assert log_file_path() is None


# --- log reader -------------------------------------------------------------------------

def _rec(event, level="info", session=None, **kw):
    r = {"ts": "2026-01-01T12:34:56.789Z", "level": level, "event": event}
    if session:
        r["session_key"] = session
    r.update(kw)
    return json.dumps(r)


@pytest.fixture
def sample_log(tmp_path):
    path = tmp_path / "gateway.jsonl"
    lines = [
        _rec("boot", logger="gateway.daemon"),
        _rec("turn_start", session="agent:main:telegram:dm:1", model="gpt 4"),
        _rec("slow", level="warning", session="agent:main:telegram:dm:1"),
        '{"ts": "2026-01-01T12:34:57.000Z", "level": "info", "ev',  # torn
        _rec("turn_start", session="agent:main:slack:group:c1"),
        _rec("crash", level="error", session="agent:ops:main",
             exception="Traceback (most recent call last):\nValueError: x"),
        _rec("noise", level="debug"),
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, lines


def test_reader_filters_by_level(sample_log):
    path, lines = sample_log
    out = io.StringIO()
    n = read_logs(path, level="warning", as_json=True, out=out)
    assert out.getvalue().splitlines() == [lines[2], lines[3], lines[5]]  # torn line kept
    assert n == 3
    with pytest.raises(ValueError, match="--level"):
        read_logs(path, level="loud", out=io.StringIO())


def test_reader_filters_by_session_exact_and_prefix(sample_log):
    path, lines = sample_log
    out = io.StringIO()
    read_logs(path, session="agent:main:telegram:dm:1", as_json=True, out=out)
    assert out.getvalue().splitlines() == [lines[1], lines[2], lines[3]]
    out = io.StringIO()
    read_logs(path, session="AGENT:MAIN", level="info", as_json=True, out=out)
    assert out.getvalue().splitlines() == [lines[1], lines[2], lines[3], lines[4]]


def test_reader_readable_rendering(sample_log):
    path, lines = sample_log
    out = io.StringIO()
    read_logs(path, out=out)
    text = out.getvalue().splitlines()
    dt = datetime.fromtimestamp(parse_iso("2026-01-01T12:34:56.789Z")).astimezone()
    local = dt.strftime("%Y-%m-%d %H:%M:%S") + ".789 " + dt.strftime("%Z")  # date and zone
    assert text[0] == f"{local} INFO    boot [gateway.daemon]"
    assert text[1] == (f'{local} INFO    turn_start session_key=agent:main:telegram:dm:1 '
                       f'model="gpt 4"')
    assert text[3] == lines[3]  # torn line shown raw
    assert text[5].startswith(f"{local} ERROR   crash session_key=agent:ops:main")
    out = io.StringIO()
    read_logs(path, out=out, utc=True)
    assert out.getvalue().splitlines()[0] == "2026-01-01 12:34:56.789 UTC INFO    boot " \
                                              "[gateway.daemon]"
    assert text[6] == "    Traceback (most recent call last):" and text[7] == "    ValueError: x"
    assert "\x1b[" not in out.getvalue()
    tty = TTYStream()
    read_logs(path, out=tty, lines=1)
    assert "\x1b[" in tty.getvalue() and "noise" in tty.getvalue()


def test_reader_tail_counts_matching_lines_and_reads_backups(tmp_path):
    path = tmp_path / "gateway.jsonl"
    (tmp_path / "gateway.jsonl.2").write_text(_rec("old0") + "\n")
    (tmp_path / "gateway.jsonl.1").write_text(_rec("old1") + "\n" + _rec("skip", "debug") + "\n")
    path.write_text("".join(_rec(f"e{i}") + "\n" for i in range(3)))
    out = io.StringIO()
    read_logs(path, lines=2, as_json=True, out=out)
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["e1", "e2"]
    out = io.StringIO()
    read_logs(path, lines=5, level="info", as_json=True, out=out)
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == \
        ["old0", "old1", "e0", "e1", "e2"]


def test_reader_tail_seeks_from_end_of_huge_file(tmp_path):
    path = tmp_path / "gateway.jsonl"
    with open(path, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB sparse hole: reading it from the start takes seconds
        f.seek(0, os.SEEK_END)
        f.write(("\n" + "\n".join(_rec(f"tail{i}") for i in range(5)) + "\n").encode())
    out = io.StringIO()
    t0 = time.perf_counter()
    read_logs(path, lines=3, as_json=True, out=out)
    assert time.perf_counter() - t0 < 1.0
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == \
        ["tail2", "tail3", "tail4"]


def test_reader_survives_nul_runs_and_missing_file(tmp_path):
    path = tmp_path / "gateway.jsonl"
    path.write_bytes(_rec("a").encode() + b"\n" + b"\0" * (3 << 20) + _rec("b").encode() + b"\n")
    out = io.StringIO()
    read_logs(path, lines=10, out=out, as_json=True)
    got = out.getvalue().splitlines()
    assert got[0] == _rec("a") and got[-1] == _rec("b") and len(got) == 2
    with pytest.raises(FileNotFoundError, match="no log file"):
        read_logs(tmp_path / "nope.jsonl", out=io.StringIO())


class _Collector(io.StringIO):
    """Thread-shared output; waits for a condition on what was written."""

    def wait_for(self, predicate, timeout=3.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.getvalue()):
                return True
            time.sleep(0.01)
        return predicate(self.getvalue())

    def events(self) -> list[str]:
        return [json.loads(x)["event"] if x.startswith("{") and x.endswith("}") else x
                for x in self.getvalue().splitlines()]


def _start_follow(path, out, **kw):
    stop = threading.Event()
    th = threading.Thread(target=read_logs, args=(path,),
                          kwargs=dict(follow=True, as_json=True, out=out, poll_interval=0.01,
                                      stop=stop, **kw), daemon=True)
    th.start()
    return stop, th


def _append(path, data: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)


def test_follow_appends_partial_lines_rotation_and_truncation(tmp_path):
    path = tmp_path / "gateway.jsonl"
    path.write_text(_rec("old") + "\n" + _rec("half")[:10])  # writer mid-line
    out = _Collector()
    stop, th = _start_follow(path, out, lines=5)
    try:
        assert out.wait_for(lambda s: "old" in s)
        time.sleep(0.05)
        assert out.events() == ["old"]  # the unfinished line is not printed yet
        _append(path, _rec("half")[10:] + "\n" + _rec("new1") + "\n")
        assert out.wait_for(lambda s: "new1" in s)
        # rotation: last words to the old file, rename, a fresh file
        _append(path, _rec("last_in_old") + "\n")
        os.rename(path, tmp_path / "gateway.jsonl.1")
        path.write_text(_rec("first_in_new") + "\n")
        assert out.wait_for(lambda s: "first_in_new" in s)
        _append(path, _rec("second_in_new") + "\n")
        assert out.wait_for(lambda s: "second_in_new" in s)
        # truncation in place (copytruncate)
        with open(path, "r+") as f:
            f.truncate(0)
        time.sleep(0.05)
        _append(path, _rec("after_truncate") + "\n")
        assert out.wait_for(lambda s: "after_truncate" in s)
        _append(path, "torn{garbage\n")
        assert out.wait_for(lambda s: "torn{garbage" in s)
    finally:
        stop.set()
        th.join(2)
    assert not th.is_alive()
    assert out.events() == ["old", "half", "new1", "last_in_old", "first_in_new",
                            "second_in_new", "after_truncate", "torn{garbage"]


def test_follow_waits_for_missing_file(tmp_path):
    path = tmp_path / "logs" / "gateway.jsonl"
    out = _Collector()
    stop, th = _start_follow(path, out)
    try:
        time.sleep(0.05)
        path.parent.mkdir()
        path.write_text(_rec("hello") + "\n")
        assert out.wait_for(lambda s: "hello" in s)
    finally:
        stop.set()
        th.join(2)
    assert not th.is_alive()


def test_follow_sees_every_line_across_real_rotations(tmp_path):
    configure_logging(state_dir=tmp_path, stream=io.StringIO(), max_bytes=6000, backups=20)
    log = get_logger("gateway.test")
    log.info("start")
    out = _Collector()
    stop, th = _start_follow(_log_path(tmp_path), out, lines=1)
    try:
        assert out.wait_for(lambda s: "start" in s)
        for batch in range(5):  # each batch rotates the file at most once
            for i in range(25):
                log.info("tick", n=batch * 25 + i, pad="y" * 60)
            assert out.wait_for(lambda s, b=batch: f'"n":{b * 25 + 24},' in s)
    finally:
        stop.set()
        th.join(2)
    close_logging()
    assert len(list((tmp_path / "logs").glob("gateway.jsonl.*"))) >= 3
    ns = [json.loads(x)["n"] for x in out.getvalue().splitlines() if '"tick"' in x]
    assert ns == list(range(125))


def test_format_record_handles_odd_values():
    line = format_record({"ts": "bad", "level": "info", "event": {"not": "str"},
                          "n": 1, "empty": "", "lst": [1, 2]})
    assert line == '????-??-?? ??:??:??.??? ??? INFO    {"not": "str"} n=1 empty="" lst=[1,2]'


def test_find_secrets_walks_config_trees():
    raw = {"channels": {"telegram": {"token": BOT_TOKEN, "dm_policy": "pairing"},
                        "slack": {"accounts": {"a": {"botToken": "xoxb-123456",
                                                     "signing_secret": "sigsecret1"}}}},
           "models": {"providers": {"o": {"api_key": SECRET, "base_url": "https://x",
                                          "headers": {"Authorization": "Bearer abcdefg"}}}},
           "agents": {"defaults": {"max_tokens": 4096}},
           "gateway": {"auth_token": "short"}}
    assert sorted(find_secrets(raw)) == sorted([BOT_TOKEN, "xoxb-123456", "sigsecret1", SECRET,
                                                "Bearer abcdefg"])


async def test_a_database_outage_is_one_line_per_library_retry_not_a_traceback(
        tmp_path, pg_dsn, pg_server):
    """asyncpg's pool logs its reconnect attempts with a traceback; in our log each is one
    line naming the error (gateway/logs/outage.py). Other library tracebacks stay."""
    import asyncio

    import asyncpg
    configure_logging(state_dir=tmp_path, stream=io.StringIO())
    pool = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
    try:
        conn = await pool.acquire()
        await asyncio.to_thread(pg_server.stop)
        try:
            with pytest.raises((OSError, asyncpg.PostgresError, asyncpg.InterfaceError)):
                await conn.fetchval("SELECT 1")  # the connection is gone: the pool repairs
            end = asyncio.get_running_loop().time() + 30
            while not _floor_lines(tmp_path):
                assert asyncio.get_running_loop().time() < end, "asyncpg logged nothing"
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(pg_server.start)
    finally:
        pool.terminate()
    try:
        raise ValueError("a real bug")
    except ValueError:
        logging.getLogger("asyncpg.pool").exception("not an outage")
    close_logging()
    [first, *_] = _floor_lines(tmp_path)
    assert "exception" not in first and "Traceback" not in json.dumps(first)
    assert re.search(r"retrying \((ConnectionRefusedError|CannotConnectNowError|OSError)",
                     first["event"]), first
    [bug] = [r for r in _lines(_log_path(tmp_path)) if r["event"] == "not an outage"]
    assert "ValueError: a real bug" in bug["exception"]


def _floor_lines(state: Path) -> list[dict]:
    path = _log_path(state)
    for h in logging.getLogger().handlers:
        h.flush()
    return [r for r in (_lines(path) if path.exists() else [])
            if r["event"].startswith("Failed to restore the pool connection floor")]


def test_a_cli_reset_inside_a_log_capture_leaves_logging_working(tmp_path):
    """capture_logs() puts back the processors it found when it ends; a reset_logging()
    inside it (a one-shot CLI command) had swapped the factory for structlog's PrintLogger,
    so the restored chain's logger-name step raised AttributeError on every later event."""
    from structlog.testing import capture_logs

    configure_logging(state_dir=tmp_path / "state", fmt="json", stream=io.StringIO())
    with capture_logs():
        reset_logging()
    out = io.StringIO()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(out))
    get_logger("after").info("still_logging", n=1)
    assert "still_logging" in out.getvalue()


def test_unconfigured_logging_writes_only_warnings_to_stderr_redacted(capsys):
    """After reset_logging() (one-shot CLI commands, tests) our events never reach stdout
    (a command's output, or another thread's redirected buffer): WARNING and above go to
    the current stderr as redacted JSON lines, the rest is dropped."""
    reset_logging()
    update_secrets(["sk-unconfigured-secret-42"])
    log = get_logger("unconfigured")
    log.info("quiet_info", n=1)
    log.debug("quiet_debug")
    log.warning("loud_warning", key="sk-unconfigured-secret-42")
    out, err = capsys.readouterr()
    assert out == ""
    lines = [json.loads(line) for line in err.splitlines()]
    assert [r["event"] for r in lines] == ["loud_warning"]
    assert lines[0]["key"] == REDACTED and lines[0]["level"] == "warning"
    assert "sk-unconfigured-secret-42" not in err
