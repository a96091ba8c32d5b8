"""Issue 8 item 7: two ids that differ only in case never share a session key, on every
id source — the OpenAI-compatible API's ``user``, webchat client ids, identity links and
bindings — while platforms whose ids are case-insensitive by construction (Telegram,
Discord numbers, Slack's upper-case ids) keep one key whatever case they arrive in."""

from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from gateway.config.load import ConfigError, parse_config
from gateway.routing import BindingRule, IdentityLinks, pick_agent, session_key_for
from tests.fakes.fake_openai import FakeOpenAI
from tests.helpers import base_config, running_gateway


@pytest.fixture
async def gateway(tmp_path):
    async with FakeOpenAI() as fake:
        async with running_gateway(base_config(tmp_path / "state", fake.base_url)) as gw:
            gw.fake = fake
            yield gw


async def test_api_users_differing_in_case_get_separate_sessions(gateway):
    gw = gateway
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=gw.token,
                                max_retries=0)
    gw.fake.script_text("noted")
    await client.chat.completions.create(
        model="tidegate/main", user="CaseUser",
        messages=[{"role": "user", "content": "My code word is PELICAN."}])
    gw.fake.script_text("I do not know one.")
    resp = await client.chat.completions.with_raw_response.create(
        model="tidegate/main", user="caseuser",
        messages=[{"role": "user", "content": "What is my code word?"}])
    second_key = resp.headers["X-Session-Key"]
    sent = json.dumps(gw.fake.requests[-1].json["messages"])
    assert "PELICAN" not in sent
    keys = {e.session_key for e in gw.agents["main"].store.entries()}
    assert second_key in keys and len(keys) == 2
    assert all(k == k.lower() for k in keys)  # keys stay lower-case
    # The same user again reaches the same session.
    gw.fake.script_text("PELICAN")
    await client.chat.completions.create(
        model="tidegate/main", user="CaseUser",
        messages=[{"role": "user", "content": "What is my code word?"}])
    assert "PELICAN" in json.dumps(gw.fake.requests[-1].json["messages"])
    assert len(gw.agents["main"].store.entries()) == 2
    await client.close()


async def test_webchat_clients_differing_in_case_get_separate_sessions(gateway):
    gw = gateway
    base = f"ws://127.0.0.1:{gw.port}"
    keys = []
    async with aiohttp.ClientSession() as s:
        for client in ("Web-A", "web-a"):
            gw.fake.script_text("ok")
            async with s.ws_connect(f"{base}/ws?token={gw.token}&client={client}") as ws:
                assert (await ws.receive_json())["type"] == "ready"
                await ws.send_json({"type": "message", "text": f"hi from {client}"})
                while (m := await ws.receive_json(timeout=10))["type"] != "reply":
                    pass
                keys.append(m["session_key"])
    assert keys[0] != keys[1]
    assert "hi from Web-A" not in json.dumps(gw.fake.requests[-1].json["messages"])


def test_platform_ids_fold_case_but_free_form_ids_do_not():
    def dm(channel: str, peer: str) -> str:
        return session_key_for(agent_id="main", channel=channel, chat_type="dm", peer_id=peer)
    assert dm("slack", "U0ABC") == dm("slack", "u0abc") == "agent:main:slack:dm:u0abc"
    assert dm("openai", "CaseUser") != dm("openai", "caseuser")
    assert dm("openai", "caseuser") == "agent:main:openai:dm:caseuser"
    assert dm("openai", "CaseUser") == "agent:main:openai:dm:%43ase%55ser"
    # An escaped form typed literally cannot collide with the id it encodes.
    assert dm("openai", "%43ase%55ser") != dm("openai", "CaseUser")
    assert dm("webchat", "É") != dm("webchat", "é")
    g1 = session_key_for(agent_id="main", channel="plugin", chat_type="group", group_id="Room",
                         thread_id="T1")
    g2 = session_key_for(agent_id="main", channel="plugin", chat_type="group", group_id="room",
                         thread_id="t1")
    assert g1 != g2


def test_identity_links_respect_the_case_of_case_sensitive_sources():
    links = IdentityLinks({"Ann": ["openai:AnnK", "telegram:42", "slack:U0ANN"],
                           "bob": ["Bobby"]})
    assert links.canonical("openai", "AnnK") == "ann"
    assert links.canonical("openai", "annk") == "annk"  # another user, not Ann
    assert links.canonical("slack", "u0ann") == "ann"  # Slack ids are case-insensitive
    assert links.canonical("webchat", "Bobby") == "bob"
    assert links.canonical("webchat", "bobby") == "bobby"
    assert links.canonical("discord", "BOBBY") == "bob"


def test_identity_link_names_differing_only_in_case_are_refused(tmp_path):
    cfg = base_config(tmp_path, session={"identity_links": {"Ann": ["telegram:1"],
                                                            "ann": ["discord:2"]}})
    with pytest.raises(ConfigError) as exc:
        parse_config(cfg, "test", env={})
    assert "session.identity_links" in str(exc.value)


def test_bindings_match_case_sensitive_ids_exactly():
    rules = [BindingRule(agent="vip", channel="openai", peer="Boss")]
    kw = {"channel": "openai", "account": "default", "group": None, "chat_type": "dm"}
    assert pick_agent(rules, "main", peer="Boss", **kw) == "vip"
    assert pick_agent(rules, "main", peer="boss", **kw) == "main"
    slack = [BindingRule(agent="vip", channel="slack", peer="U0BOSS")]
    assert pick_agent(slack, "main", peer="u0boss", **{**kw, "channel": "slack"}) == "vip"


def test_typed_session_keys_keep_the_case_of_case_sensitive_ids():
    from gateway.routing import canonical_key
    key = session_key_for(agent_id="main", channel="openai", chat_type="dm", peer_id="CaseUser")
    assert canonical_key("agent:main:openai:dm:CaseUser") == key
    assert canonical_key(key) == key  # canonical keys are fixed points
    assert canonical_key("AGENT:Main:MAIN") == "agent:main:main"
    assert canonical_key("agent:main:Slack:group:C0GEN:thread:1.2") == \
        "agent:main:slack:group:c0gen:thread:1.2"
    assert canonical_key("agent:main:cron:ABC123") == "agent:main:cron:abc123"


async def test_an_explicit_session_key_names_that_user_not_another(gateway):
    gw = gateway
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{gw.port}/v1", api_key=gw.token,
                                max_retries=0)
    gw.fake.script_text("noted")
    await client.chat.completions.create(
        model="tidegate/main", user="caseuser",
        messages=[{"role": "user", "content": "My code word is HERON."}])
    gw.fake.script_text("?")
    resp = await client.chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "user", "content": "What is my code word?"}],
        extra_headers={"X-Session-Key": "agent:main:openai:dm:CaseUser"})
    assert resp.headers["X-Session-Key"] == "agent:main:openai:dm:CaseUser"  # as written
    assert "HERON" not in json.dumps(gw.fake.requests[-1].json["messages"])
    await client.close()
