"""Issue 8 item 14: every chunk is non-empty, keeps its indentation and has balanced fences,
indented fences included — in ``split_text`` and through the whole gateway (the real
discord.py client against FakeDiscord, the fake model)."""

from __future__ import annotations

import re

import pytest

from channels.outbound.chunking import split_text
from tests.channel_harness import until
from tests.helpers import base_config, running_gateway

FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


def fence_lines(chunk: str) -> list[str]:
    return [ln for ln in chunk.split("\n") if FENCE.match(ln)]


def content_lines(chunk: str) -> list[str]:
    return [ln for ln in chunk.split("\n") if ln.strip() and not FENCE.match(ln)]


def check(chunks: list[str], limit: int) -> None:
    for c in chunks:
        assert len(c) <= limit, c
        assert content_lines(c), f"empty chunk {c!r}"
        assert len(fence_lines(c)) % 2 == 0, f"unbalanced fences in {c!r}"
        for opener in fence_lines(c)[::2]:  # an opener at column 0 or with its context
            assert opener == opener.lstrip() or not c.startswith(opener), c


def test_indented_first_line_longer_than_the_limit():
    text = "```python\n    " + "x" * 300 + "\n```"
    chunks = split_text(text, 160)
    check(chunks, 160)
    assert chunks[0].startswith("```python\n    xxx")  # indentation kept
    assert "".join(content_lines(c)[0] for c in chunks).strip() == "x" * 300


@pytest.mark.parametrize("indent", [2, 3, 4, 6])
def test_an_indented_fence_keeps_its_fences_in_every_chunk(indent):
    pad = " " * indent
    lines = [ln for i in range(20) for ln in (f"{pad}def f{i}():", f"{pad}    return {i}")]
    text = "1. Install:\n\n" + f"{pad}```python\n" + "\n".join(lines) + f"\n{pad}```\n2. Done"
    chunks = split_text(text, 120)
    check(chunks, 120)
    got = [ln for c in chunks for ln in content_lines(c) if "return" in ln or "def" in ln]
    # Relative indentation survives (a body line is 4 deeper than its def).
    for d, r in zip(got[::2], got[1::2]):
        assert len(r) - len(r.lstrip()) == len(d) - len(d.lstrip()) + 4
    assert len(got) == 40


def test_property_random_indented_code_blocks():
    import random
    rnd = random.Random(8)
    for _ in range(200):
        indent = " " * rnd.choice([0, 1, 3, 4, 8])
        body = "\n".join(indent + " " * rnd.choice([0, 4, 8]) + "y" * rnd.randint(0, 250)
                         for _ in range(rnd.randint(1, 6)))
        text = rnd.choice(["", "intro text\n\n"]) + f"{indent}```js\n{body}\n{indent}```"
        limit = rnd.randint(40, 200)
        check(split_text(text, limit), limit)


@pytest.mark.timeout(30)
async def test_indented_code_through_discord(tmp_path, model, dc):
    reply = "```python\n    " + "x" * 4500 + "\n```\nThat's all."
    model.script_text(reply)
    section = {"enabled": True, "token": dc.token, "api_base_url": dc.api_url,
               "gateway_url": dc.gateway_url, "dm_policy": "open"}
    cfg = base_config(tmp_path / "state", model.base_url, channels={"discord": section})
    async with running_gateway(cfg):
        await dc.send_dm("the code please")
        dm = dc.dm_channels[dc.alice.id]

        def parts() -> list[str]:
            return [s["payload"]["content"] for s in dc.sent_messages(dm)]
        await until(lambda: "That's all." in "".join(parts()), what="every part")
    check(parts(), 2000)
    assert parts()[0].startswith("```python\n    xxx")
    assert sum(c.count("x") for c in parts()) == 4500
