"""Media building blocks (issue 12): MIME sniffing from bytes, safe inbox names, MEDIA:
lines, upload limits, vision defaults and keep_turns, and config errors naming the key."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from channels.media.outbound import upload_kind, upload_problem
from channels.media.sniff import sniff_mime
from channels.media.store import safe_name, store_inbox
from gateway.config.load import ConfigError, parse_config
from runtime.media.outbound import split_media_lines, stage_media
from runtime.media.ref import MediaRef
from runtime.media.vision import MediaPolicy, default_vision
from runtime.providers.base import ChatMessage, ModelRequest
from runtime.tools.registry import ToolError
from runtime.tools.secrets import NO_SECRETS
from tests.media_files import jpeg, ogg_voice, png, tiny_pdf


def test_mime_is_sniffed_from_bytes_not_the_name():
    assert sniff_mime(jpeg(10, 10), "notes.txt") == "image/jpeg"
    assert sniff_mime(png(), "x.jpg") == "image/png"
    assert sniff_mime(tiny_pdf("x"), "a.exe") == "application/pdf"
    assert sniff_mime(ogg_voice(), "") == "audio/ogg"
    assert sniff_mime(b"# Title\nhello", "readme.md") == "text/markdown"
    assert sniff_mime(b"\x00\x01binary", "script.py") == "application/octet-stream"
    assert sniff_mime("héllo wörld".encode(), "") == "text/plain"
    # short magic numbers need the rest of their header: text that merely starts with
    # "BM" or "ID3" stays text (and is inlined), a real BMP/MP3 tag is still recognised
    assert sniff_mime(b"BMI notes: weight 70 kg\n", "bmi.txt") == "text/plain"
    assert sniff_mime(b"ID3 tags explained\n", "id3.md") == "text/markdown"
    bmp = io.BytesIO()
    Image.new("RGB", (4, 4)).save(bmp, "BMP")
    assert sniff_mime(bmp.getvalue(), "x.txt") == "image/bmp"
    assert sniff_mime(b"ID3\x04\x00\x00\x00\x00\x00\x10" + b"\x00" * 20, "") == "audio/mpeg"


def test_inbox_paths_are_safe_and_content_addressed(tmp_path):
    assert safe_name("../../etc/passwd", "text/plain") == "passwd.txt"
    assert safe_name("my photo (1).JPG", "image/jpeg") == "my_photo_1_.JPG"
    assert safe_name("...", "image/png") == "file.png"
    ref = store_inbox(tmp_path, b"same bytes", "a b.txt", now=1_767_225_600.0)
    again = store_inbox(tmp_path, b"same bytes", "a b.txt", now=1_767_225_600.0)
    assert ref == again and ref.path.startswith("inbox/2026-01-01/")
    assert (tmp_path / ref.path).read_bytes() == b"same bytes"
    assert MediaRef.from_dict(ref.to_dict()) == ref


def test_media_lines_are_split_out_except_in_code(tmp_path):
    text, items = split_media_lines("Here.\nMEDIA: out/a.png\n```\nMEDIA: x\n```\n MEDIA: `b.pdf`")
    assert items == ["out/a.png", "b.pdf"] and "MEDIA: x" in text and "out/a.png" not in text
    assert split_media_lines("no media") == ("no media", [])
    (tmp_path / "a.png").write_bytes(png())
    stage = tmp_path / "stage"
    copy, canon = stage_media(tmp_path, "a.png", NO_SECRETS, stage)
    assert canon == "a.png" and copy.read_bytes() == png() and stage in copy.parents
    assert stage_media(tmp_path, str(tmp_path / "a.png"), NO_SECRETS, stage)[0] == copy
    for bad in ("../x", "/etc/passwd", "missing.png"):
        with pytest.raises(ToolError):
            stage_media(tmp_path, bad, NO_SECRETS, stage)


def test_upload_kinds_and_platform_limits(tmp_path):
    (tmp_path / "p.png").write_bytes(png())
    (tmp_path / "v.ogg").write_bytes(ogg_voice())
    (tmp_path / "d.pdf").write_bytes(tiny_pdf("x"))
    assert [upload_kind(tmp_path / n)[0] for n in ("p.png", "v.ogg", "d.pdf")] == [
        "photo", "voice", "document"]
    big = tmp_path / "big.bin"
    with open(big, "wb") as fh:
        fh.truncate(11 * 1024 * 1024)
    assert "discord accepts at most 10.0 MB" in upload_problem("discord", big)
    assert upload_problem("telegram", big) is None  # 50 MB for documents
    assert upload_problem("slack", tmp_path / "nope") == "nope: not a file"


def _req(*msgs: ChatMessage) -> ModelRequest:
    return ModelRequest(model="m", system="", messages=list(msgs))


async def test_vision_defaults_and_keep_turns(tmp_path):
    assert default_vision("anthropic", "claude-sonnet-4-5")
    assert default_vision("openai", "gpt-4o-mini") and default_vision("openai", "llava:13b")
    assert not default_vision("openai", "gpt-3.5-turbo")
    assert not default_vision("openai", "deepseek-chat")
    ref = store_inbox(tmp_path, jpeg(100, 80), "p.jpg", now=0)
    user = lambda t: ChatMessage(role="user", content=t, media=[ref])
    policy = MediaPolicy(workspace=tmp_path, keep_turns=2,
                         vision={"p/text-only": False, "p/seer": True})
    req = _req(user("old"), ChatMessage(role="assistant", content="ok"), user("mid"),
               user("new"))
    out = await policy.prepare(req, "p/seer")
    shown = [bool(m.images) for m in out.messages]
    assert shown == [False, False, True, True]
    assert "earlier turn's image" in out.messages[0].content
    assert base64.b64decode(out.messages[3].images[0].data)[:3] == b"\xff\xd8\xff"
    assert req.messages[3].images == []  # the turn's own list is never changed
    blind = await policy.prepare(req, "p/text-only")
    assert not any(m.images for m in blind.messages)
    assert "cannot see images" in blind.messages[3].content


@pytest.mark.parametrize("section,message", [
    ({"media": {"audio": {"transcription": {"provider": "nope"}}}},
     "media.audio.transcription.provider"),
    ({"mcp": {"servers": {"x": {"command": "a", "url": "http://b"}}}}, "mcp.servers.x"),
    ({"mcp": {"servers": {"bad name": {"command": "a"}}}}, "mcp.servers"),
    ({"tools": {"web": {"search": {"provider": "google"}}}}, "tools.web.search.provider"),
    ({"media": {"image": {"max_side": 10}}}, "media.image.max_side"),
])
def test_bad_media_tool_and_mcp_config_names_the_key(section, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        parse_config(section, "t", env={})


async def test_providers_send_real_image_parts(tmp_path):
    from runtime.media.images import encode_image
    from runtime.providers.anthropic_provider import AnthropicProvider
    from runtime.providers.openai_provider import OpenAIProvider
    from tests.fakes.fake_anthropic import FakeAnthropic
    from tests.fakes.fake_openai import FakeOpenAI

    ref = store_inbox(tmp_path, jpeg(2400, 1200), "p.jpg", now=0)
    img = encode_image(tmp_path / ref.path, ref.sha256, 1568)
    msg = ChatMessage(role="user", content="what is it?", media=[ref], images=[img])
    async with FakeAnthropic() as fake:
        fake.script_text("a stripe pattern")
        provider = AnthropicProvider("anthropic", fake.base_url, "sk-ant-test-key")
        resp = await provider.complete(_req(msg))
        await provider.close()
        assert resp.text == "a stripe pattern"  # the fake validated the image block
        [block, text] = fake.requests[-1].json["messages"][0]["content"]
        assert block["type"] == "image" and block["source"]["media_type"] == "image/jpeg"
        assert base64.b64decode(block["source"]["data"]) == base64.b64decode(img.data)
        assert text == {"type": "text", "text": "what is it?"}
    async with FakeOpenAI() as fake:
        fake.script_text("stripes")
        provider = OpenAIProvider("openai", fake.base_url, "sk-test-key")
        await provider.complete(_req(msg))
        await provider.close()
        parts = fake.requests[-1].json["messages"][0]["content"]
        assert parts[0] == {"type": "text", "text": "what is it?"}
        assert parts[1]["image_url"]["url"] == img.data_url


async def test_intake_encodes_an_image_while_storing_it(tmp_path):
    """bench/media_bench.py: the vision encoding is made at intake, next to the inbox
    write, so the model call finds it ready; one encoding per (bytes, max_side) even when
    several callers ask at once."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from gateway.inbound.media import MediaIntake
    from runtime.clock import FakeClock
    from runtime.media import images
    from runtime.media.config import MediaSettings

    images.cache_clear()
    intake = MediaIntake(MediaSettings(), FakeClock())
    photo = jpeg(3000, 2000)
    ref = await intake._store(tmp_path, photo, "photo.jpg", True)
    assert (tmp_path / ref.path).read_bytes() == photo
    (tmp_path / ref.path).unlink()  # the model call needs neither the file nor a re-encode
    part = images.encode_image(tmp_path / ref.path, ref.sha256, 1568)
    with Image.open(io.BytesIO(base64.b64decode(part.data))) as seen:
        assert seen.size == (1568, 1045) and seen.format == "JPEG"

    calls = []
    real = images._encode_bytes

    def counting(raw, side):
        calls.append(side)
        return real(raw, side)

    images._encode_bytes = counting
    try:
        other = jpeg(2500, 2500, (10, 200, 10))
        with ThreadPoolExecutor(4) as pool:
            parts = list(pool.map(lambda _: images._encoded(("k", 800), lambda: other),
                                  range(8)))
    finally:
        images._encode_bytes = real
    assert calls == [800] and len({p.data for p in parts}) == 1



def test_a_pdf_whose_text_cannot_be_read_gets_a_note(tmp_path):
    """A corrupt PDF used to add nothing: the model did not know it had not read it."""
    from runtime.media.documents import document_text
    from runtime.media.ref import MediaRef
    (tmp_path / "bad.pdf").write_bytes(b"%PDF-1.4\n%\xe2\xe3 this is no pdf body\n%%EOF")
    ref = MediaRef(path="bad.pdf", mime="application/pdf", size=40, sha256="0" * 64,
                   name="report.pdf")
    note = document_text(tmp_path, ref)
    assert note is not None and note.startswith('PDF "report.pdf": its text could not be read')
