"""Session keys, identity links and bindings (DESIGN.md "Session keys")."""

import pytest

from gateway.routing import (
    BindingRule,
    IdentityLinks,
    Route,
    agent_of_key,
    cron_session_key,
    main_session_key,
    normalize_id,
    pick_agent,
    session_key_for,
)


def dm(**kw):
    base = {"agent_id": "main", "channel": "telegram", "chat_type": "dm", "peer_id": "42",
            "account_id": "default"}
    return session_key_for(**{**base, **kw})


def test_dm_scopes():
    assert dm(dm_scope="main") == "agent:main:main"
    assert dm(dm_scope="per-peer") == "agent:main:dm:42"
    assert dm(dm_scope="per-channel-peer") == "agent:main:telegram:dm:42"
    assert dm(dm_scope="per-account-channel-peer", account_id="Work") == \
        "agent:main:telegram:work:dm:42"
    assert dm() == "agent:main:telegram:dm:42"  # per-channel-peer is the default


def test_group_and_thread_keys_differ_from_dm():
    g = session_key_for(agent_id="main", channel="slack", chat_type="channel",
                        group_id="C0GENERAL", peer_id="U1")
    t = session_key_for(agent_id="main", channel="slack", chat_type="thread",
                        group_id="C0GENERAL", thread_id="1700000000.000100", peer_id="U1")
    d = session_key_for(agent_id="main", channel="slack", chat_type="dm", peer_id="U1")
    assert g == "agent:main:slack:group:c0general"
    assert t == "agent:main:slack:group:c0general:thread:1700000000.000100"
    assert len({g, t, d}) == 3


def test_same_conversation_same_key_whatever_case_or_form():
    assert dm(peer_id="ABC") == dm(peer_id="abc") == dm(peer_id=" abc ")
    assert dm(peer_id=42) == dm(peer_id="42")
    assert dm(channel="Telegram") == dm(channel="telegram")


def test_ids_with_colons_cannot_collide():
    a = session_key_for(agent_id="main", channel="x", chat_type="group", group_id="a:thread:b")
    b = session_key_for(agent_id="main", channel="x", chat_type="thread", group_id="a",
                        thread_id="b")
    assert a != b
    assert normalize_id("a:b%c") == "a%3ab%25c"
    with pytest.raises(ValueError):
        normalize_id("  ")


def test_special_keys_and_agent_of_key():
    assert main_session_key("Main") == "agent:main:main"
    assert cron_session_key("main", "Job1") == "agent:main:cron:job1"
    assert agent_of_key("agent:work:telegram:dm:1") == "work"
    with pytest.raises(ValueError):
        agent_of_key("telegram:dm:1")


def test_identity_links_merge_people_across_channels():
    links = IdentityLinks({"alice": ["telegram:123", "discord:456", "U999"]})
    assert links.canonical("telegram", "123") == "alice"
    assert links.canonical("discord", "456") == "alice"
    assert links.canonical("slack", "u999") == "alice"
    assert links.canonical("telegram", "456") == "456"
    k1 = dm(peer_id=links.canonical("telegram", "123"), dm_scope="per-peer")
    k2 = dm(channel="discord", peer_id=links.canonical("discord", "456"), dm_scope="per-peer")
    assert k1 == k2 == "agent:main:dm:alice"


def test_bindings_most_specific_wins():
    rules = [BindingRule(agent="chan", channel="telegram"),
             BindingRule(agent="acct", channel="telegram", account="work"),
             BindingRule(agent="peer", peer="42")]
    kw = {"channel": "telegram", "peer": "7", "group": None, "chat_type": "dm"}
    assert pick_agent(rules, "main", account="default", **kw) == "chan"
    assert pick_agent(rules, "main", account="work", **kw) == "acct"
    assert pick_agent(rules, "main", account="work", **{**kw, "peer": "42"}) == "peer"
    assert pick_agent(rules, "main", account="x", channel="slack", peer="1", group=None,
                      chat_type="dm") == "main"


def test_route_targets():
    assert Route.parse_target("telegram:42") == Route("telegram", "42")
    assert Route.parse_target("slack:C1:171.2") == Route("slack", "C1", thread="171.2")
    with pytest.raises(ValueError):
        Route.parse_target("telegram")
    r = Route("discord", "9", "acc", "t")
    assert Route.from_dict(r.as_dict()) == r


def test_matrix_targets_keep_the_server_part_of_their_ids():
    assert Route.parse_target("matrix:@alice:example.org") == Route(
        "matrix", "@alice:example.org")
    assert Route.parse_target("matrix:!room:hs.example:8448:$root") == Route(
        "matrix", "!room:hs.example:8448", thread="$root")
    assert Route.from_tool("matrix:work", "!room:hs:$root") == Route(
        "matrix", "!room:hs", "work", "$root")
    # other platforms split as before, sigil or not
    assert Route.parse_target("telegram:@news:5") == Route("telegram", "@news", thread="5")


def test_a_thread_inside_a_dm_stays_in_the_dm_session():
    assert dm(thread_id="1712.5") == dm() == "agent:main:telegram:dm:42"


@pytest.mark.parametrize("typed", ["agent:main:openai:dm:CaseUser", "agent:main:dm:ÄrgerÖ",
                                   "agent:main:webchat:dm:a%3ab", "agent:main:main",
                                   "agent:main:slack:group:c1:thread:1700.1"])
def test_readable_key_shows_the_case_and_round_trips(typed):
    from gateway.routing import canonical_key, readable_key
    key = canonical_key(typed)
    assert readable_key(key) == typed
    assert canonical_key(readable_key(key)) == key
