"""A lean start (issue 9 "cold start to the first answer <= 1 s"): a gateway whose config
has no Slack/Telegram/Discord channel, no Anthropic provider and no MCP server starts and
answers a turn through the OpenAI-compatible provider without importing the libraries only
those need, nor the ones only a later tool call, a rendered reply or a scrape needs
(numpy/bm25s for memory_search, markdown-it for platform markup, unidiff for apply_patch,
prometheus-client for ``GET /metrics``). Each is then loaded when its feature is first
used. Runs in a fresh interpreter and reads its ``sys.modules``."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ROOT

HEAVY = ["discord", "slack_bolt", "slack_sdk", "telegram", "openai", "anthropic", "httpx",
         "mcp", "numpy", "bm25s", "markdown_it", "unidiff", "PIL", "pypdf", "trafilatura",
         "lxml", "playwright", "asyncpg", "prometheus_client"]

# Our own modules that only features the first answer does not use need: a chat route's
# streaming, reactions and media; the log reader; the memory index and the web clients;
# inbound files; compaction; timeline export; a remote outbox's spill; the built-in tools'
# code (their declarations are all the registry and the model need); the cron job model
# while there is no job. Each loads when its feature is first used (issue 9, "pay for what
# you use").
LAZY_OURS = ["channels.outbound.streaming", "channels.outbound.render",
             "channels.outbound.chunking", "channels.outbound.delivery",
             "channels.outbound.markup", "channels.media.outbound", "gateway.outbound.media",
             "gateway.outbound.reactions", "runtime.media.outbound", "gateway.logs.reader",
             "gateway.logs.records", "runtime.memory", "runtime.tools.web.fetch",
             "runtime.tools.web.guard", "runtime.tools.web.search",
             "channels.media.sniff", "channels.media.store", "runtime.media.documents",
             "runtime.media.images", "runtime.media.ref", "runtime.media.transcribe",
             "runtime.compaction", "runtime.timeline.export", "runtime.storage.outbox",
             "channels.outbound.spill", "runtime.storage.embedded.outbox_spill",
             "runtime.tools.channel", "runtime.tools.cron_tool", "runtime.tools.exec",
             "runtime.tools.fs", "runtime.tools.memory_tool", "runtime.tools.message",
             "runtime.tools.patch", "runtime.tools.sessions", "scheduler.cron.job"]

# Regular expressions of ours that only a later event needs (a silent or heartbeat reply,
# an image for a model, a channel going down, a torn journal line), by a fragment of each:
# compiled by their first use, not at import.
LAZY_PATTERNS = ["NO_REPLY", "HEARTBEAT_OK", "<!--.*?(-->", "gpt-4o", "other getupdates",
                 '"session_key":"(']

SCRIPT = textwrap.dedent("""
    import asyncio, json, re, sys, tempfile
    from pathlib import Path

    compiled, compile_pattern = [], re._compile
    def recording(pattern, flags):
        compiled.append(str(getattr(pattern, "pattern", pattern)))
        return compile_pattern(pattern, flags)
    re._compile = recording  # every re.compile/re.match/... goes through it

    from tests.fakes.fake_openai import FakeOpenAI

    def loaded():
        return sorted({m.split(".")[0] for m in sys.modules})

    def ours():
        return sorted(m for m in sys.modules
                      if m.split(".")[0] in ("gateway", "channels", "runtime", "scheduler"))

    async def main():
        async with FakeOpenAI() as fake:
            from gateway.config.load import parse_config
            from gateway.service.daemon import Gateway
            state = Path(tempfile.mkdtemp())
            cfg = {"gateway": {"state_dir": str(state), "port": 0},
                   "skills": {"personal_dir": str(state / "personal-skills")},
                   "models": {"providers": {"fake": {
                       "api": "openai", "base_url": fake.base_url, "api_key": "sk-x"}}},
                   "agents": {"defaults": {"model": "fake/fake-model"}}}
            gw = Gateway(parse_config(cfg, "test", env={}))
            await gw.start()
            fake.script_text("**hello** there")
            result = await gw.local.send("hi")
            out = {"answer": result.text, "after_turn": loaded(), "ours_after_turn": ours(),
                   "patterns_after_turn": list(compiled)}
            import aiohttp
            async with aiohttp.ClientSession() as http, http.get(
                    f"http://127.0.0.1:{gw.port}/metrics",
                    headers={"Authorization": f"Bearer {gw.token}"}) as r:
                out["metrics"] = [r.status, await r.text()]
            from channels.outbound.markup import to_telegram_html
            from runtime.memory import MemoryIndex
            from runtime.tools.patch import _plan
            (state / "ws").mkdir()
            (state / "ws" / "MEMORY.md").write_text("The deploy key lives in vault.")
            out["hits"] = len(MemoryIndex(state / "ws").search("deploy key", now=0))
            out["html"] = to_telegram_html("**bold**")
            try:
                _plan(state / "ws", "not a diff")
            except Exception as exc:
                out["patch_error"] = type(exc).__name__
            from channels.outbound.silent import silent_reply
            from scheduler.heartbeat.rules import strip_heartbeat_ack
            out["silent"] = silent_reply("**NO_REPLY**").silent
            out["ack"] = strip_heartbeat_ack("HEARTBEAT_OK").is_ack
            out["after_use"], out["ours_after_use"] = loaded(), ours()
            out["patterns_after_use"] = list(compiled)
            await gw.stop()
        print(json.dumps(out))

    asyncio.run(main())
""")


@functools.cache
def _start_and_turn() -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_default_start_and_turn_import_no_heavy_library():
    out = _start_and_turn()
    assert out["answer"] == "**hello** there"
    assert [m for m in HEAVY if m in out["after_turn"]] == []
    # the first scrape loads prometheus-client and shows what was counted before it
    status, text = out["metrics"]
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert samples[("tidegate_turns_total", (("status", "ok"), ("trigger", "user")))] == 1
    assert samples[("tidegate_model_calls_total", (("error_class", "none"),
                    ("model", "fake-model"), ("provider", "fake")))] == 1
    assert samples[("tidegate_turn_duration_seconds_count", (("trigger", "user"),))] == 1
    assert ("tidegate_turns_created", (("status", "ok"), ("trigger", "user"))) in samples
    # ... and each is there once its feature is used
    assert out["hits"] == 1 and out["html"] == "<b>bold</b>"
    assert out["patch_error"] == "ToolError"
    assert {"bm25s", "numpy", "markdown_it", "unidiff", "prometheus_client"} <= set(
        out["after_use"])


def test_default_start_and_turn_import_none_of_our_feature_modules():
    """The same start and turn leave out our own modules of features it does not use."""
    out = _start_and_turn()
    assert out["answer"] == "**hello** there"
    assert [m for m in LAZY_OURS if m in out["ours_after_turn"]] == []
    assert {"runtime.memory", "channels.outbound.markup"} <= set(out["ours_after_use"])


def test_default_start_and_turn_compile_none_of_our_later_patterns():
    out = _start_and_turn()
    assert out["answer"] == "**hello** there"
    assert [f for f in LAZY_PATTERNS if any(f in p for p in out["patterns_after_turn"])] == []
    # ... and a silent or heartbeat reply compiles its patterns and is still recognised
    assert out["silent"] is True and out["ack"] is True
    after = out["patterns_after_use"]
    assert all(any(f in p for p in after) for f in ("NO_REPLY", "HEARTBEAT_OK"))


TLS_SCRIPT = textwrap.dedent("""
    import asyncio, gc, json, ssl, sys
    from gateway.service import cold_start

    cold_start.begin()
    import aiohttp, aiohttp.connector
    from aiohttp import web
    out = {"gc_held": not gc.isenabled(),
           "roots_at_import": aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()[
               "x509_ca"]}

    async def main():
        app = web.Application()
        app.router.add_get("/", lambda request: web.Response(text="verified"))
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(sys.argv[1], sys.argv[2])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        async with aiohttp.ClientSession() as http:
            async with http.get(f"https://127.0.0.1:{port}/") as r:
                out["answer"] = await r.text()
        await runner.cleanup()
        out["roots_after_use"] = aiohttp.connector._SSL_CONTEXT_VERIFIED.cert_store_stats()[
            "x509_ca"]

    asyncio.run(main())
    cold_start.finish()
    out["gc_after"] = gc.isenabled()
    print(json.dumps(out))
""")


def _ca_and_server_cert(tmp_path):
    """A throwaway CA (written as the only system root, via SSL_CERT_FILE) and a server
    certificate for 127.0.0.1 signed by it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    span = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))

    def cert(subject, issuer, key, sign_key, ca):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(span[0]).not_valid_after(span[1])
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(sign_key, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tidegate test CA")])
    ca = cert(ca_name, ca_name, ca_key, ca_key, True)
    leaf = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name,
                key, ca_key, False)
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(pem))
    (tmp_path / "cert.pem").write_bytes(leaf.public_bytes(pem))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def test_gateway_process_defers_aiohttp_ca_roots_until_a_tls_connection(tmp_path):
    """``tidegate gateway`` imports aiohttp without loading the CA bundle into its default
    client contexts (no outgoing TLS on the default config); the first TLS connection
    loads them and verifies the peer against them. GC is held during start."""
    _ca_and_server_cert(tmp_path)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("SSL_CERT")}
    env["SSL_CERT_FILE"] = str(tmp_path / "ca.pem")
    proc = subprocess.run([sys.executable, "-c", TLS_SCRIPT, str(tmp_path / "cert.pem"),
                           str(tmp_path / "key.pem")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["gc_held"] and out["gc_after"]
    assert out["roots_at_import"] == 0
    assert out["answer"] == "verified" and out["roots_after_use"] >= 1
