"""The documentation: generated reference pages match the code, config.example.yaml and
the schema describe the same keys, and the user docs name no issues, seeds or machine
paths. (`mkdocs build --strict` — broken links, orphan pages — runs in .ci/run.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from gateway.reference import REGENERATE, pages
from gateway.reference.config_ref import config_keys

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def test_generated_reference_pages_are_up_to_date():
    stale = [rel for rel, render in pages().items()
             if not (DOCS / rel).exists() or (DOCS / rel).read_text(encoding="utf-8") != render()]
    assert not stale, f"out of date: {', '.join(stale)}; regenerate with: {REGENERATE}"


def test_check_mode_names_a_stale_page_and_the_command(tmp_path):
    for rel, render in pages().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(render(), encoding="utf-8")
    cli = tmp_path / "reference" / "cli.md"
    cli.write_text(cli.read_text() + "stale line\n")
    r = subprocess.run([sys.executable, "-m", "gateway.reference", "--check", "--docs",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1
    assert "reference/cli.md" in r.stderr and REGENERATE in r.stderr
    assert "configuration.md" not in r.stderr


def test_every_schema_key_has_a_description():
    missing = [k.path for k in config_keys() if not k.description and not k.same_as]
    assert not missing, f"config keys without a Field description: {missing}"


def _example_paths(node: object, prefix: str = "") -> list[str]:
    if not isinstance(node, dict):
        return []
    out = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        out.append(path)
        out += _example_paths(value, path + ".")
    return out


def _schema_path(example: str, known: dict) -> str | None:
    """The schema key (a row of the reference) of an example path, or None when the
    schema has no such key. A mapping key (a provider name, a group id) stands for
    ``<name>``; below a section documented once (``same_as``) the walk goes on under that
    section's path."""
    prefix, row, key_next = "", None, False
    for part in example.split("."):
        candidate = f"{prefix}{part}"
        if candidate in known:
            row, same = candidate, known[candidate].same_as
            prefix, key_next = (same or candidate) + ".", bool(same and same.endswith("<name>"))
        elif key_next:  # the mapping key of a section documented elsewhere
            key_next = False
        elif any(k.startswith(f"{prefix}<name>.") for k in known):
            prefix += "<name>."
        else:
            return None
    return row


def test_config_example_keys_are_the_documented_schema_keys():
    text = (ROOT / "config.example.yaml").read_text(encoding="utf-8")
    example = yaml.safe_load(re.sub(r"\$\{[^}]*\}", "x", text))
    keys = {k.path: k for k in config_keys()}
    unknown = [p for p in _example_paths(example) if _schema_path(p, keys) is None]
    assert not unknown, f"config.example.yaml keys the schema does not have: {unknown}"
    top_level = {p for p in keys if "." not in p}
    assert top_level <= set(example), f"sections missing from config.example.yaml: " \
                                      f"{sorted(top_level - set(example))}"
    reference = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    for p in _example_paths(example):
        row = _schema_path(p, keys)
        assert f"`{row}`\n:   " in reference or f"## `{row}`" in reference, p


# Issue numbers, seed references and paths of the machine the docs were written on.
_FORBIDDEN = [
    (re.compile(r"\bissues? #?\d+", re.IGNORECASE), "an issue number"),
    (re.compile(r"(?<![\w/])#\d{1,4}\b"), "an issue number"),
    (re.compile(r"\bseeds?\b[ /]*\d{3}|seeds/|§\s?\d", re.IGNORECASE), "a seed reference"),
    # (an example user's home, /home/me or /home/you, is an illustration, not a machine's)
    (re.compile(r"(?<![\w.])/(work|root|tmp/pytest)/|(?<![\w.])/(home|Users)/(?!(me|you|user)/)"),
     "a machine path"),
]


def _user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_user_docs_name_no_issues_seeds_or_machine_paths():
    found = []
    for path in _user_docs():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for pattern, what in _FORBIDDEN:
                m = pattern.search(line)
                if m:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {what}: {m.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_hygiene_check_catches_each_kind():
    for bad in ("fixed in issue 25", "see #12", "seed 001 §2.3", "/work/shared/x.py",
                "/home/alice/.tidegate", "/root/x"):
        assert any(p.search(bad) for p, _ in _FORBIDDEN), bad
    for fine in ("channel_id 123", "`~/.tidegate`", "color #fff", "C#", "/home/you/.tidegate"):
        assert not any(p.search(fine) for p, _ in _FORBIDDEN), fine


def test_readme_is_short_and_runs_the_ci_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 10 * 1024
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if line.startswith("python3 -m venv") and "pytest" in line)
    assert command.replace(" -q ", " ", 1) in readme, "README and .ci/run test commands differ"


def _subcommands(parser: object) -> dict | None:
    import argparse
    return next((a.choices for a in getattr(parser, "_actions", ())
                 if isinstance(a, argparse._SubParsersAction)), None)


def test_every_tidegate_command_the_docs_name_exists():
    """`tidegate <command> [<subcommand>]` in the user docs is a command of the CLI."""
    from gateway.cli.main import build_parser
    top = _subcommands(build_parser())
    word = re.compile(r"[a-z][a-z-]*")
    unknown = []
    for path in _user_docs():
        for m in re.finditer(r"`tidegate ([^`\n]*)`", path.read_text(encoding="utf-8")):
            words = m.group(1).split()
            if not words or not word.fullmatch(words[0]):
                continue  # `tidegate --config … gateway`, `tidegate COMMAND --help`
            sub = _subcommands(top.get(words[0]))
            if words[0] not in top or (sub and len(words) > 1 and word.fullmatch(words[1])
                                       and words[1] not in sub):
                unknown.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert not unknown, "\n".join(unknown)
