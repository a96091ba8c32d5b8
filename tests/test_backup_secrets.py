"""Secrets stay out of a backup in the less obvious places too: a commented-out key, a
token shape under any key, copies of the secret files; and a URL's password never
reaches the log (the archived logs would carry it)."""

from __future__ import annotations

import pytest

from gateway.backup.archive import create_backup
from gateway.backup.secrets import holds_literal_secret
from gateway.logs.redact import Redactor

HIDDEN = ["models:\n  p:\n    api_key: ${K}\n# api_key: sk-live-COMMENTED1\n",
          "models:  # old key: api_key: hunter2hunter2\n  p: {}\n",
          "# storage: {dsn: 'postgresql://tg:hunter2@db/tg'}\nstorage: {}\n",
          "models:\n  p:\n    headers: {X-Auth: sk-live-0123456789abcdefgh}\n",
          'models:\n  p:\n    api_key_command: "echo sk-live-0123456789abcdefgh"\n',
          "mcp:\n  s:\n    env: {GITHUB_PAT: ghp_0123456789abcdefghijABCDEFGHIJ0123}\n",
          "mcp:\n  s:\n    env: {GH: ghp_0123456789abcdefghijABCDEFGHIJ0123}\n",
          "models:\n  p:\n    base_url: https://x.test/v1?key=AIzaSyA0123456789abcdefghijklmnopqrstu\n",
          "x:\n  credentials:\n    user: me\n    pass: hunter2hunter2\n"]
PLAIN = ["# the api key comes from tidegate.env\nmodels:\n  p:\n    api_key: ${K}\n",
         "# api_key: ${OPENAI_API_KEY}\n# token: see the docs\nmodels: {}\n",
         "models:\n  p:\n    headers:\n      Authorization: Bearer ${TOKEN}  # from the env\n",
         "channels:\n  webchat:\n    title: 'chat #1'\n"]


@pytest.mark.parametrize("text", HIDDEN)
def test_a_secret_in_a_comment_or_a_token_shape_is_found(text):
    assert holds_literal_secret(text)


@pytest.mark.parametrize("text", PLAIN)
def test_comments_and_references_without_a_secret_are_no_secret(text):
    assert not holds_literal_secret(text)


def test_copies_of_secret_files_are_left_out_and_named(tmp_path):
    state = tmp_path / "state"
    (state / "agents").mkdir(parents=True)
    (state / "agents" / "a.txt").write_text("a")
    for name in ("tidegate.env", "tidegate.env.bak", "tidegate.env~", "gateway.token",
                 "gateway.token.orig", "prod.env"):
        (state / name).write_text("OPENAI_API_KEY=sk-live-0123456789abcdef\n")
    (state / "config.yaml.bak").write_text("models:\n  p: {api_key: sk-live-1}\n")
    (state / "config.yaml.orig").write_text("models:\n  p: {api_key: '${K}'}\n")
    made = create_backup(state, tmp_path / "b.tgz")
    assert made.secrets_left_out == ["config.yaml.bak", "gateway.token", "gateway.token.orig",
                                     "prod.env", "tidegate.env", "tidegate.env.bak",
                                     "tidegate.env~"]
    import tarfile
    with tarfile.open(made.path) as tar:
        names = sorted(m.name for m in tar)
    assert names == ["MANIFEST.json", "state/agents/a.txt", "state/config.yaml.orig"]


def test_a_url_password_never_reaches_the_log():
    r = Redactor()
    assert r.redact("endpoint=http://u:pwURLSECRET@127.0.0.1:18913") == \
        "endpoint=http://u:***@127.0.0.1:18913"
    assert r.redact_value({"endpoint": "https://otel:s3cr3t-pw@collector.test/v1"}) == \
        {"endpoint": "https://otel:***@collector.test/v1"}
    for kept in ("http://127.0.0.1:4318/v1/traces", "https://user@host/x",
                 "postgresql://user:password@host:port/db", "postgresql://tg:${PG}@db/tg"):
        assert r.redact(kept) == kept
