"""``tidegate setup`` and the live probes for the platforms that came as channel plugins
(WhatsApp, email, Matrix): the wizard driven through a pty as a user types, its checks
against the WhatsApp fake, real Dovecot + aiosmtpd and a real Synapse, a wrong token or
password of each refused with the platform's reason and asked again; then
``channels status --probe`` on the written config; and a third-party plugin without
setup questions or a probe getting the generic messages."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pexpect
import pytest
import yaml

from channels.registry import channel_names
from tests.fakes.fake_whatsapp import FakeWhatsApp
from tests.helpers import ROOT
from tests.mail_servers import PASSWORD, Dovecot, SmtpSink
from tests.synapse_server import SynapseMissing, shared_synapse

pytestmark = pytest.mark.timeout(120)
NEW = ("whatsapp", "email", "matrix")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEGATE_")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def synapse():
    try:
        return shared_synapse()
    except SynapseMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="module")
def mail_servers():
    imap, smtp = Dovecot(users=("bot3",)).start(), SmtpSink().start()
    yield imap, smtp
    smtp.stop()
    imap.close()


def _answer_whatsapp(child: pexpect.spawn, wa: FakeWhatsApp) -> None:
    for phone_id, token in ((wa.phone_number_id, "EAAG-revoked"), ("", wa.token)):
        child.expect("phone number id")
        child.sendline(phone_id)  # the second time Enter keeps the last answer
        child.expect(r"access token.*\(hidden\)")
        child.sendline(token)
        for secret in ("app-secret-1", "verify-1"):
            child.expect(r"\(hidden\)")
            child.sendline(secret)
        if token != wa.token:  # refused by the Graph API: everything asked again
            child.expect(r"that did not work: HTTP 401 \(token rejected\)")
    child.expect(r"ok: whatsapp number \+1 555-010-0000 \(Tidegate Test\)")


def _answer_email(child: pexpect.spawn, imap: Dovecot, smtp: SmtpSink, wrong: str) -> None:
    answers = [("email address", "bot3@tide.test"), ("IMAP server host", "127.0.0.1"),
               ("IMAP security", "starttls"), ("IMAP port", str(imap.port)),
               ("IMAP login", "bot3"), ("IMAP password", wrong),
               ("SMTP server host", ""), ("SMTP security", "none"),
               ("SMTP port", str(smtp.port)), ("CA file", str(imap.ca_file))]
    for attempt in (1, 2):
        for prompt, value in answers:
            child.expect(prompt)
            child.sendline(value if attempt == 1 or prompt == "IMAP password" else "")
        if attempt == 1:
            child.expect("that did not work: IMAP 127.0.0.1:.* login refused for bot3")
            answers[5] = ("IMAP password", PASSWORD)
    child.expect(r"ok: email IMAP 127.0.0.1:\d+ \(starttls\): bot3 logged in, INBOX selected; "
                 r"SMTP 127.0.0.1:\d+ \(none\): EHLO answered")


def _answer_matrix(child: pexpect.spawn, url: str, login) -> None:
    child.expect("homeserver URL")
    child.sendline(url)
    child.expect("user id")
    child.sendline(login.user_id)
    child.expect(r"access token.*\(hidden\)")
    child.sendline("")  # no token: the password is asked
    child.expect(r"password of the bot \(hidden\)")
    child.sendline("not-the-password")
    child.expect(r"that did not work: login: HTTP 403 \(password refused\)")
    child.expect("homeserver URL")
    child.sendline("")
    child.expect("user id")
    child.sendline("")
    child.expect(r"access token.*\(hidden\)")
    child.sendline(login.access_token)
    child.expect(f"ok: matrix {login.user_id} on {url} \\(access token\\)")


async def test_the_wizard_sets_up_whatsapp_email_and_matrix_checking_each_live(
        tmp_path, synapse, mail_servers):
    imap, smtp = mail_servers
    login = synapse.register("setupbot")
    wa = await FakeWhatsApp().start()
    state = tmp_path / "state"
    wrong = "wrong-imap-pass-3"

    def drive() -> tuple[int, str]:
        child = pexpect.spawn(sys.executable, [
            "-m", "gateway.cli", "setup", "--state-dir", str(state),
            "--whatsapp-api-base-url", wa.url], cwd=str(ROOT), env=_env(),
            encoding="utf-8", timeout=60)
        child.logfile_read = seen = io.StringIO()
        child.expect(r"Model provider")
        child.sendline("echo")
        child.expect("Your timezone")
        child.sendline("UTC")
        for name in channel_names():
            child.expect(f"Connect {name}")
            child.sendline("yes" if name in NEW else "no")
            if name == "whatsapp":
                _answer_whatsapp(child, wa)
            elif name == "email":
                _answer_email(child, imap, smtp, wrong)
            elif name == "matrix":
                _answer_matrix(child, synapse.url, login)
        child.expect("Who may DM the bot")
        child.sendline("allowlist")
        for name in [n for n in channel_names() if n in NEW]:  # each platform's allowlist
            child.expect(f"{name}: who may DM the bot")
            child.sendline({"email": "alice@example.org, @friends.test",
                            "matrix": "@alice:example.org"}.get(name, ""))
        child.expect("whatsapp: dm_policy allowlist with no allow_from")
        child.expect("wrote ")
        child.expect(pexpect.EOF)
        child.close()
        return child.exitstatus, seen.getvalue()

    try:
        code, seen = await asyncio.to_thread(drive)
    finally:
        await wa.stop()
    assert code == 0, seen
    cfg = yaml.safe_load((state / "config.yaml").read_text())
    ch = cfg["channels"]
    assert ch["whatsapp"]["access_token"] == "${WHATSAPP_ACCESS_TOKEN}"
    assert ch["email"]["imap_password"] == "${EMAIL_PASSWORD}"
    assert ch["email"]["imap_security"] == "starttls" and "smtp_host" not in ch["email"]
    assert ch["email"]["imap_port"] == imap.port  # a number, as the model reads it
    assert ch["matrix"] == {"enabled": True, "homeserver": synapse.url,
                            "user_id": login.user_id,
                            "access_token": "${MATRIX_ACCESS_TOKEN}",
                            "dm_policy": "allowlist", "allow_from": ["@alice:example.org"]}
    assert ch["email"]["allow_from"] == ["alice@example.org", "@friends.test"]
    assert ch["whatsapp"]["dm_policy"] == "allowlist" and "allow_from" not in ch["whatsapp"]
    env_text = (state / "tidegate.env").read_text()
    assert f"EMAIL_PASSWORD={PASSWORD}" in env_text
    assert f"MATRIX_ACCESS_TOKEN={login.access_token}" in env_text
    assert f"WHATSAPP_ACCESS_TOKEN={wa.token}" in env_text
    for secret in (PASSWORD, login.access_token, wa.token, wrong):
        assert secret not in (state / "config.yaml").read_text()
        assert secret not in seen  # hidden input is never echoed
    # the written config checks out live with the probes (WhatsApp's fake is gone: a
    # clear failure; email and Matrix: ok), the secrets read from the env file
    r = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gateway.cli", "channels", "status", "--probe",
                         "--json", "--config", str(state / "config.yaml")], cwd=ROOT,
        env=_env(), capture_output=True, text=True, timeout=60)
    probes = json.loads(r.stdout)["probes"]
    assert probes["email"]["ok"] is True and probes["matrix"]["ok"] is True, probes
    assert probes["whatsapp"]["ok"] is False
    assert probes["whatsapp"]["detail"].startswith("unreachable"), probes
    assert r.returncode == 1


def test_non_interactive_email_keeps_its_allowlist_and_takes_allow_from(
        tmp_path, mail_servers, monkeypatch, capsys):
    """--dm-policy pairing does not loosen email's allowlist default; --allow-from
    CHANNEL:ID fills channels.<channel>.allow_from; a bad one is refused before any check."""
    from gateway.cli.main import main as cli_main
    imap, smtp = mail_servers
    monkeypatch.setenv("QA_MAIL", PASSWORD)
    state = tmp_path / "state"
    args = ["setup", "--non-interactive", "--state-dir", str(state), "--provider", "echo",
            "--timezone", "UTC", "--email-address", "bot3@tide.test",
            "--email-imap-host", "127.0.0.1", "--email-imap-security", "starttls",
            "--email-imap-port", str(imap.port), "--email-imap-username", "bot3",
            "--email-imap-password-env", "QA_MAIL", "--email-smtp-security", "none",
            "--email-smtp-port", str(smtp.port), "--email-tls-ca-file", str(imap.ca_file),
            "--dm-policy", "pairing"]
    assert cli_main([*args, "--allow-from", "alice@example.org"]) == 2
    assert "expected CHANNEL:ID" in capsys.readouterr().err
    assert cli_main([*args, "--allow-from", "telegram:42"]) == 2
    assert "telegram is not set up in this run (set up: email)" in capsys.readouterr().err
    assert not state.exists()
    code = cli_main([*args, "--allow-from", "email:alice@example.org",
                     "--allow-from", "EMAIL:@friends.test"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert ("email: dm_policy stays allowlist (its default; pairing is looser) — change "
            "channels.email.dm_policy in config.yaml to override it") in out
    email = yaml.safe_load((state / "config.yaml").read_text())["channels"]["email"]
    assert (email["dm_policy"], email["allow_from"]) == (
        "allowlist", ["alice@example.org", "@friends.test"])


async def test_the_matrix_probe_checks_a_token_or_a_password_and_leaves_no_device(synapse):
    from channels.matrix.config import MatrixAccount
    from channels.matrix.plugin import PLUGIN
    from channels.probing import check_account
    login = synapse.register("probebot")

    def account(**keys: str) -> MatrixAccount:
        return MatrixAccount(homeserver=synapse.url, user_id=login.user_id, **keys)

    assert await check_account(PLUGIN, account(access_token=login.access_token)) == (
        True, f"{login.user_id} on {synapse.url} (access token)")
    assert await check_account(PLUGIN, account(access_token="syt_bad_token")) == (
        False, "HTTP 401 (token rejected)")
    assert await check_account(PLUGIN, account(password=login.password)) == (
        True, f"{login.user_id} on {synapse.url} (password login)")
    assert await check_account(PLUGIN, account(password="wrong-pass")) == (
        False, "login: HTTP 403 (password refused)")
    other = synapse.register("someoneelse")
    ok, detail = await check_account(PLUGIN, account(access_token=other.access_token))
    assert ok is False and "belongs to @someoneelse" in detail
    from tests.matrix_user import MatrixUser
    user = MatrixUser(synapse.url, login)
    try:  # the password check logged its own device out again
        devices = (await user.call("GET", "/_matrix/client/v3/devices"))["devices"]
    finally:
        await user.close()
    assert [d["device_id"] for d in devices] == [login.device_id]


PLAIN_PLUGIN = '''
from channels.sdk import AccountConfig, ChannelPlugin

class Config(AccountConfig):
    enabled: bool = False

PLUGIN = ChannelPlugin(name="pond", config=Config, create=lambda a, c, ctx: None,
                       sdk_version="1.1")
'''


def test_a_plugin_without_setup_questions_or_probe_gets_the_generic_messages(
        tmp_path, monkeypatch, capsys):
    from gateway.cli.main import main as cli_main
    from runtime import plugins
    site = tmp_path / "site"
    site.mkdir()
    (site / "pond_plain.py").write_text(textwrap.dedent(PLAIN_PLUGIN))
    info = site / "tidegate_pond-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tidegate-pond\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tidegate.channels]\npond = pond_plain:PLUGIN\n")
    monkeypatch.syspath_prepend(str(site))
    plugins.forget()
    try:
        config = tmp_path / "config.yaml"
        config.write_text(yaml.safe_dump({"gateway": {"state_dir": str(tmp_path / "s")},
                                          "channels": {"pond": {"enabled": True}}}))
        code = cli_main(["channels", "status", "--probe", "--config", str(config)])
        out = capsys.readouterr()
        assert code == 0, out  # nothing failed: there is nothing to check
        assert ("probe pond: skipped — no live check: the pond plugin offers none (check it "
                "by starting the gateway: tidegate status)") in out.out
        answers = "\n".join(["echo", "UTC", *["no"] * len(channel_names()), ""]) + "\n"
        monkeypatch.setattr(sys, "stdin", io.StringIO(answers))
        with contextlib.suppress(SystemExit):
            code = cli_main(["setup", "--state-dir", str(tmp_path / "w")])
        out = capsys.readouterr()
        assert code == 0, out
        assert ("pond: its plugin asks no setup questions; configure channels.pond in "
                "config.yaml as its documentation says") in out.out
        assert "Connect pond" not in out.out
    finally:
        plugins.forget()
        sys.modules.pop("pond_plain", None)


async def test_a_probe_never_leaks_a_secret_and_a_crashing_probe_is_a_failure():
    from channels.probing import check_account
    from channels.sdk import AccountConfig, ChannelPlugin, SetupField

    class Config(AccountConfig):
        token: str | None = None

    async def echo(account, timeout):  # a careless probe repeating the token
        return False, f"server said: bad token {account.token}"

    async def crash(account, timeout):
        raise KeyError("user")

    fields = (SetupField("token", "token", secret=True),)
    careless = ChannelPlugin(name="careless", config=Config, create=None, setup=fields,
                             probe=echo)
    assert await check_account(careless, Config(token="tok-12345")) == (
        False, "server said: bad token ***")
    assert await check_account(careless, Config(token="${POND_TOKEN}")) == (
        False, "channels.careless.token: ${POND_TOKEN} is not set (see --env-file)")
    broken = ChannelPlugin(name="broken", config=Config, create=None, probe=crash)
    assert await check_account(broken, Config()) == (
        False, "the check failed: KeyError: 'user'")
