"""Skills through the whole gateway against the fake model (issue 11 "How it is proven"):
precedence across all six sources, the budget cut by binary search, requirements gating,
``~`` shortening, a byte-stable prompt prefix until a skill file changes, malformed skills,
``always`` skills, and the ``tidegate skills`` CLI (list, show, check, install)."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main as cli_main
from runtime.clock import FakeClock
from runtime.skills.budget import HEADER, largest_prefix, render
from tests.fakes.fake_openai import FakeOpenAI
from tests.scheduler_harness import T0, config, gateway, system_prompt


@pytest.fixture
async def fake():
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def skill(root, dirname: str, name: str | None = None, desc: str = "", body: str = "Do it.",
          **meta) -> str:
    path = root / dirname / "SKILL.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    front = {"name": name or dirname, "description": desc or f"{dirname} skill", **meta}
    path.write_text(f"---\n{yaml.safe_dump(front)}---\n{body}\n")
    return str(path)


def skills_cfg(tmp_path, url, **skills) -> dict:
    (tmp_path / "extra").mkdir(exist_ok=True)
    cfg = config(tmp_path, url)
    cfg["skills"] = {"extra_dirs": [str(tmp_path / "extra")],
                     "personal_dir": "~/.agents/skills", **skills}
    return cfg


def dirs(tmp_path, home) -> dict:
    ws = tmp_path / "state" / "workspace" / "main"
    return {"extra": tmp_path / "extra", "managed": tmp_path / "state" / "skills",
            "personal": home / ".agents" / "skills", "project": ws / ".agents" / "skills",
            "workspace": ws / "skills"}


def skills_lines(prompt: str) -> list[str]:
    section = prompt.split(HEADER, 1)[1].split("\n\n# ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("- ")]


async def first_prompt(cfg, fake) -> str:
    async with gateway(cfg, FakeClock(T0)) as gw:
        await gw.local.send("hi")
        return system_prompt(fake.requests[-1])


async def test_precedence_across_all_six_sources(tmp_path, fake, home):
    d = dirs(tmp_path, home)
    order = ["extra", "managed", "personal", "project", "workspace"]
    for i, source in enumerate(order):
        for later in order[i:]:
            skill(d[source], f"s-{later}", desc=f"from {source}")
    skill(d["extra"], "memory", desc="extra memory loses to bundled")
    skill(d["managed"], "scheduling", desc="managed scheduling beats bundled")
    lines = skills_lines(await first_prompt(skills_cfg(tmp_path, fake.base_url), fake))
    by_name = {ln.split(":")[0][2:]: ln for ln in lines}
    for source in order:  # each s-<source> is defined by every lower source too
        assert f"from {source} (" in by_name[f"s-{source}"]
    assert by_name["s-workspace"] == "- s-workspace: from workspace (skills/s-workspace/SKILL.md)"
    assert by_name["s-project"].endswith("(.agents/skills/s-project/SKILL.md)")
    assert by_name["s-personal"].endswith("(~/.agents/skills/s-personal/SKILL.md)")  # ~
    assert "bundled" in by_name["memory"] and "What to remember" in by_name["memory"]
    assert "managed scheduling beats bundled" in by_name["scheduling"]
    assert "subagents" in by_name and str(home) not in "\n".join(lines)

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(skills_cfg(tmp_path, fake.base_url)))
    assert cli_main(["--config", str(path), "skills", "list", "--json"]) == 0


async def test_cli_list_show_and_overrides(tmp_path, fake, home, capsys):
    d = dirs(tmp_path, home)
    skill(d["extra"], "memory", desc="extra memory")
    skill(d["workspace"], "memory", desc="my memory rules")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(skills_cfg(tmp_path, fake.base_url)))
    assert cli_main(["--config", str(path), "skills", "list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    mem = next(s for s in out["skills"] if s["name"] == "memory")
    assert (mem["source"], mem["description"], mem["in_prompt"]) == \
        ("workspace", "my memory rules", True)
    assert {"name": "memory", "source": "extra", "by": "bundled"} in out["overridden"]
    assert {"name": "memory", "source": "bundled", "by": "workspace"} in out["overridden"]
    assert cli_main(["--config", str(path), "skills", "show", "scheduling"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("scheduling (bundled)") and "HEARTBEAT.md" in shown
    assert cli_main(["--config", str(path), "skills", "show", "nope"]) == 1


async def test_budget_cut_by_binary_search_151_skills_40kb(tmp_path, fake, home):
    d = dirs(tmp_path, home)
    for i in range(151):  # ~265 chars each: 151 * 265 = 40 KB of skills text
        skill(d["workspace"], f"k{i:03d}", desc=f"skill number {i} " + "x" * 220)
    cfg = skills_cfg(tmp_path, fake.base_url, bundled=False, extra_dirs=[])
    async with gateway(cfg, FakeClock(T0)) as gw:
        await gw.local.send("hi")
        prompt = system_prompt(fake.requests[-1])
        section = gw.agents["main"].skills.section()
    lines = skills_lines(prompt)
    entries = [f"- k{i:03d}: skill number {i} {'x' * 220} (skills/k{i:03d}/SKILL.md)"
               for i in range(151)]
    assert sum(len(e) + 1 for e in entries) > 40_000
    # the largest prefix that fits, found independently by a linear scan
    fit = max(k for k in range(151) if len(render(entries[:k])) <= 30_000)
    assert lines == entries[:fit] and 100 < fit < 150
    assert largest_prefix(entries[:150], 30_000) == fit
    assert len(render(lines)) <= 30_000 < len(render(entries[:fit + 1]))
    assert (section.cut_by_count, section.cut_by_chars) == (1, 150 - fit)


async def test_requirements_gate_skills_and_list_says_why(tmp_path, fake, home, capsys,
                                                          monkeypatch):
    d = dirs(tmp_path, home)
    monkeypatch.setenv("TIDEGATE_SKILL_KEY", "set")
    skill(d["workspace"], "needs-nothing-odd", requires={"bins": ["sh"],
                                                         "env": ["TIDEGATE_SKILL_KEY"]})
    skill(d["workspace"], "needs-bin", requires={"bins": ["tidegate-no-such-binary"]})
    skill(d["workspace"], "needs-env", requires={"env": ["TIDEGATE_UNSET_VAR"]})
    skill(d["workspace"], "needs-os", requires={"os": ["windows"]})
    skill(d["workspace"], "nested", metadata={"openclaw": {"requires": {"bins": ["nope-x"]}}})
    lines = skills_lines(await first_prompt(skills_cfg(tmp_path, fake.base_url), fake))
    names = [ln.split(":")[0][2:] for ln in lines]
    assert "needs-nothing-odd" in names
    assert not {"needs-bin", "needs-env", "needs-os", "nested"} & set(names)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(skills_cfg(tmp_path, fake.base_url)))
    capsys.readouterr()
    assert cli_main(["--config", str(path), "skills", "list"]) == 0
    out = capsys.readouterr().out
    assert "needs-bin" in out and "not offered: missing bin:tidegate-no-such-binary" in out
    assert "not offered: missing env:TIDEGATE_UNSET_VAR" in out
    assert "not offered: missing os:win32" in out


async def test_prefix_byte_stable_until_a_skill_file_changes(tmp_path, fake, home):
    d = dirs(tmp_path, home)
    md = skill(d["personal"], "weather", desc="Forecasts")
    clock = FakeClock(T0)
    async with gateway(skills_cfg(tmp_path, fake.base_url), clock) as gw:
        for text in ("one", "two", "three"):
            await gw.local.send(text)
            await clock.advance(5)
        prompt = gw.agents["main"].prompt
        assert prompt.rebuilds == 1 and gw.agents["main"].skills.rescans == 1
        Path(md).write_text(Path(md).read_text() + "More detail.\n")
        await gw.local.send("four")
        assert prompt.rebuilds == 2
        skill(d["personal"], "weather", desc="Forecasts and alerts")
        os.utime(md, (T0 + 99, T0 + 99))
        await clock.advance(5)
        await gw.local.send("five")
    systems = [system_prompt(r) for r in fake.requests]
    prefixes = [s[:s.index("# Time Awareness")] for s in systems]
    assert prefixes[0] == prefixes[1] == prefixes[2] == prefixes[3]  # body-only edit
    assert "Forecasts and alerts" in prefixes[4] and "Forecasts and alerts" not in prefixes[3]


async def test_malformed_skills_are_skipped_with_one_diagnostic(tmp_path, fake, home, capsys):
    d = dirs(tmp_path, home)
    ws = d["workspace"]
    (ws / "bad-yaml").mkdir(parents=True)
    (ws / "bad-yaml" / "SKILL.md").write_text("---\nname: [unclosed\n---\nbody\n")
    (ws / "no-name").mkdir()
    (ws / "no-name" / "SKILL.md").write_text("---\ndescription: nameless\n---\nbody\n")
    (ws / "no-front").mkdir()
    (ws / "no-front" / "SKILL.md").write_text("# just markdown\n")
    big = ws / "huge" / "SKILL.md"
    big.parent.mkdir()
    big.write_text("---\nname: huge\n---\n" + "y" * (256 * 1024))
    skill(ws, "a-dup", name="twin", desc="first twin")
    skill(ws, "b-dup", name="twin", desc="second twin")
    skill(ws, "fine")
    lines = skills_lines(await first_prompt(skills_cfg(tmp_path, fake.base_url), fake))
    names = [ln.split(":")[0][2:] for ln in lines]
    assert "fine" in names and "huge" not in names
    assert [ln for ln in lines if ln.startswith("- twin:")] == [
        "- twin: first twin (skills/a-dup/SKILL.md)"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(skills_cfg(tmp_path, fake.base_url)))
    capsys.readouterr()  # the gateway's own log lines
    assert cli_main(["--config", str(path), "skills", "check", "--json"]) == 1
    diags = json.loads(capsys.readouterr().out)["diagnostics"]
    assert len(diags) == 5
    joined = "\n".join(diags)
    assert "bad-yaml/SKILL.md: skipped: front matter is not valid YAML" in joined
    assert "no-name/SKILL.md: skipped: front matter has no name" in joined
    assert "no-front/SKILL.md: skipped: no front matter" in joined
    assert "huge/SKILL.md: skipped: file is 2621" in joined
    assert "bytes, over the 262144-byte limit" in joined
    assert "b-dup/SKILL.md: skipped: duplicate skill name 'twin'" in joined
    # `skills list` names the skipped files in its output, not as log warnings on stderr
    assert cli_main(["--config", str(path), "skills", "list"]) == 0
    out, err = capsys.readouterr()
    assert "skill_skipped" not in err and err == ""
    assert "  skipped: " in out and "no-front/SKILL.md: skipped: no front matter" in out


async def test_budget_cut_keeps_higher_sources_and_list_says_cut(tmp_path, fake, home,
                                                                  capsys):
    """Over ``max_skills`` the cut goes by source precedence (the operator's workspace
    skills before extra-dir ones), not by name; ``skills list`` says which were cut."""
    d = dirs(tmp_path, home)
    for name in ("alpha", "beta"):
        skill(d["extra"], name)
    for name in ("yak", "zebra"):
        skill(d["workspace"], name)
    cfg = skills_cfg(tmp_path, fake.base_url, bundled=False, max_skills=2)
    names = [ln.split(":")[0][2:] for ln in skills_lines(await first_prompt(cfg, fake))]
    assert names == ["yak", "zebra"]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    assert cli_main(["--config", str(path), "skills", "list"]) == 0
    rows = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()}
    assert "cut by the prompt budget" in rows["alpha"] and "offered" not in rows["alpha"]
    assert " offered " in rows["zebra"] + " "


async def test_always_skill_body_is_inlined(tmp_path, fake, home):
    d = dirs(tmp_path, home)
    skill(d["workspace"], "house-rules", desc="Rules", body="Never book flights.", always=True)
    prompt = await first_prompt(skills_cfg(tmp_path, fake.base_url), fake)
    section = prompt.split(HEADER, 1)[1]
    assert section.startswith("\n- house-rules: Rules (skills/house-rules/SKILL.md)\n"
                              "<skill name=\"house-rules\">\nNever book flights.\n</skill>")


async def test_install_directory_and_archive_then_read_by_tilde_path(tmp_path, fake, home,
                                                                     capsys):
    src = tmp_path / "src"
    skill(src, "deploy", desc="How to deploy")
    skill(src / "pack", "lint", desc="How to lint")
    skill(src / "pack", "fmt", desc="How to format")
    archive = tmp_path / "pack.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src / "pack", arcname="pack")
    cfg = skills_cfg(tmp_path, fake.base_url, managed_dir=str(home / "managed"))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli_main(["--config", str(path), "skills", "install", str(src / "deploy")]) == 0
    assert capsys.readouterr().out.startswith("installed deploy -> ")
    assert cli_main(["--config", str(path), "skills", "install", str(archive),
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["installed"]] == ["fmt", "lint"]
    assert (home / "managed" / "lint" / "SKILL.md").is_file()
    bad = tmp_path / "bad"
    (bad / "x").mkdir(parents=True)
    (bad / "x" / "SKILL.md").write_text("no front matter")
    assert cli_main(["--config", str(path), "skills", "install", str(bad)]) == 1
    assert not (home / "managed" / "x").exists()
    async with gateway(cfg, FakeClock(T0)) as gw:
        fake.script_tool_call("read", {"path": "~/managed/deploy/SKILL.md"})
        fake.script_text("ok")
        await gw.local.send("deploy please")
        lines = skills_lines(system_prompt(fake.requests[0]))
        assert "- deploy: How to deploy (~/managed/deploy/SKILL.md)" in lines
        assert "Do it." in fake.requests[-1].json["messages"][-1]["content"]
        fake.script_tool_call("read", {"path": "~/.bashrc"})
        fake.script_text("no")
        await gw.local.send("read my bashrc")
        assert "absolute" in fake.requests[-1].json["messages"][-1]["content"]


def test_signature_lists_directories_only_when_they_change_and_sees_every_edit(tmp_path):
    """The per-turn skills check (issue 11: ≤ 5 ms) stats each SKILL.md but lists a
    source directory again only when its own stat changed; edits in place, atomic
    replaces, a SKILL.md appearing in an existing directory, new and removed skill
    directories are all seen."""
    from runtime.skills.catalog import SkillCatalog

    ws = tmp_path / "ws"
    for i in range(20):
        skill(ws / "skills", f"s{i:02d}")
    (ws / "skills" / "empty").mkdir()
    catalog = SkillCatalog.for_workspace(ws, extra=[], managed=None, personal=None,
                                         bundled=False)
    root = ws / "skills"

    def settle() -> None:  # as a running gateway sees them: changed over 2 s ago
        old = os.stat(root).st_mtime - 60
        os.utime(root, (old, old))

    settle()
    first = catalog.signature()
    assert len(first) == 20
    listed = catalog._sig.listings
    for _ in range(50):
        assert catalog.signature() == first
    assert catalog._sig.listings == listed  # no directory listing per check
    assert catalog.scan().skills.keys() >= {"s00", "s19"}
    rescans = catalog.rescans

    path = root / "s03" / "SKILL.md"
    path.write_text(path.read_text() + "More text.\n")  # edit in place
    assert catalog.signature() != first
    assert "More text." in catalog.scan().skills["s03"].body
    skill(root, "empty", name="late", desc="appeared later")  # new file, same directories
    assert catalog.scan().skills["late"].description == "appeared later"
    assert catalog._sig.listings == listed
    skill(root, "brand-new")  # a new directory: the root's mtime moves
    assert "brand-new" in catalog.scan().skills
    settle()
    (root / "s05" / "SKILL.md").unlink()
    (root / "s05").rmdir()
    settle()
    assert "s05" not in catalog.scan().skills
    assert catalog.rescans == rescans + 4


def _git(*args, cwd=None) -> str:
    import subprocess

    env = {"PATH": os.environ["PATH"], "HOME": str(cwd or "/nonexistent"),
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


def _bare_repo(tmp_path, name: str, fill) -> Path:
    """A bare repository ``<name>.git`` whose main branch holds what ``fill(worktree)``
    wrote (tag v1 on it)."""
    work = tmp_path / f"{name}-work"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    fill(work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "skills", cwd=work)
    _git("tag", "v1", cwd=work)
    bare = tmp_path / f"{name}.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    return bare


def test_install_from_git_repositories_with_the_same_checks(tmp_path, home, capsys):
    def published(work):
        skill(work / "skills", "review", desc="How to review a PR")
        skill(work / "skills", "release", desc="How to cut a release")
        (work / "README.md").write_text("my skills\n")

    repo = _bare_repo(tmp_path, "team-skills", published)
    managed = home / "managed"
    cfg = skills_cfg(tmp_path, "http://127.0.0.1:9", managed_dir=str(managed))
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cli = ["--config", str(path), "skills", "install"]

    assert cli_main([*cli, f"file://{repo}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["installed"]] == ["release", "review"]
    assert "How to review a PR" in (managed / "review" / "SKILL.md").read_text()
    assert not list(managed.rglob(".git"))  # the clone's metadata is not installed

    # a local bare repository path with a tag; an update replaces the managed copy
    def single(work):
        skill(work, "", name="lint", desc="Lint v1")
    lint = _bare_repo(tmp_path, "lint", single)
    assert cli_main([*cli, f"{lint}#v1"]) == 0
    assert capsys.readouterr().out.startswith("installed lint -> ")
    assert "Lint v1" in (managed / "lint" / "SKILL.md").read_text()

    secret = home / ".ssh" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY")

    def leaky(work):
        skill(work, "steal", desc="innocent")
        (work / "steal" / "key.txt").symlink_to(secret)
    bad = _bare_repo(tmp_path, "leaky", leaky)
    assert cli_main([*cli, f"git+file://{bad}"]) == 1
    assert "symlink leaves the source" in capsys.readouterr().err
    assert not (managed / "steal").exists()
    leaky(tmp_path / "local")  # the same refusal for a local directory
    assert cli_main([*cli, str(tmp_path / "local" / "steal")]) == 1
    assert "symlink leaves the source" in capsys.readouterr().err
    assert "PRIVATE KEY" not in "".join(p.read_text() for p in managed.rglob("*")
                                        if p.is_file())

    def malformed(work):
        skill(work, "good")
        (work / "broken").mkdir()
        (work / "broken" / "SKILL.md").write_text("no front matter")
    broken = _bare_repo(tmp_path, "broken", malformed)
    assert cli_main([*cli, f"file://{broken}"]) == 1
    assert "broken/SKILL.md" in capsys.readouterr().err
    assert not (managed / "good").exists()  # nothing of a refused source is installed

    assert cli_main([*cli, f"file://{tmp_path}/missing.git"]) == 1
    assert "git clone" in capsys.readouterr().err
    assert cli_main([*cli, f"file://{repo}#no-such-branch"]) == 1
    assert "failed" in capsys.readouterr().err
    assert cli_main([*cli, f"file://{repo}#--upload-pack=x"]) == 1
    assert "invalid git ref" in capsys.readouterr().err


def test_a_missing_extra_dir_is_reported(tmp_path, home, capsys):
    """A typo in ``skills.extra_dirs`` hid every skill in it without a word; ``skills
    check`` and ``doctor`` now name the directory."""
    cfg = config(tmp_path, "http://127.0.0.1:9/v1")
    cfg["skills"] = {"extra_dirs": [str(tmp_path / "sklls"), str(tmp_path / "file")]}
    (tmp_path / "file").write_text("not a directory")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli_main(["--config", str(path), "skills", "check", "--json"]) == 1
    diags = json.loads(capsys.readouterr().out)["diagnostics"]
    assert diags == [
        f"extra: {tmp_path / 'sklls'}: the skills.extra_dirs directory does not exist",
        f"extra: {tmp_path / 'file'}: skills.extra_dirs entry is not a directory"]
    cli_main(["--config", str(path), "doctor", "--json"])
    report = capsys.readouterr().out
    assert "the skills.extra_dirs directory does not exist" in report
