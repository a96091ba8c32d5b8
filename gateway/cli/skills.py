"""``tidegate skills list|show NAME|check|install PATH [--agent A] [--json]`` (seed 001 §7).

Read straight from the skill sources of the agent (no running gateway needed): ``list``
shows every effective skill with its source and whether it is offered (and if not, the
missing requirements) and which skills a higher source overrides; ``check`` prints the
skipped files and duplicates (exit 1 when there are any) and the budget cut; ``install``
copies a skill directory, archive or git repository into the managed source (``<state_dir>/skills``);
the gateway picks it up at its next turn (the file signature changed).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gateway.cli.output import print_json, quiet_logs
from gateway.config.load import LoadedConfig

# gateway.tools.services pulls in every tool module: imported when a skills command runs,
# not when the CLI builds its parser (`agent -m` stays fast).


def _catalog(args: argparse.Namespace, loaded: LoadedConfig) -> Any:
    from gateway.tools.services import skill_catalog
    from runtime.clock import SYSTEM_CLOCK
    cfg = loaded.config
    agent = (args.agent or cfg.default_agent()).lower()
    cfg.agent(agent)
    return skill_catalog(cfg, agent, loaded.state_dir, SYSTEM_CLOCK)


@quiet_logs(level="error")  # skipped files are in the output
def list_skills(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    catalog = _catalog(args, loaded)
    scan = catalog.scan()
    section = catalog.section()
    rows = [{**s.as_dict(), "in_prompt": s.name in section.included}
            for s in scan.skills.values()]
    if args.json:
        print_json({"skills": rows, "overridden": [
            {"name": n, "source": lost, "by": won} for n, lost, won in scan.overridden]})
        return 0
    for r in rows:
        flags = " always" if r["always"] else ""
        print(f"{r['name']:<24} {r['source']:<9} {_state(r)}{flags}  {r['path']}")
    for name, lost, won in scan.overridden:
        print(f"  {name}: {lost} copy overridden by {won}")
    for line in scan.diagnostics:
        print(f"  skipped: {line}")
    return 0


def _state(row: dict[str, Any]) -> str:
    """offered | cut by the prompt budget | not offered: missing ..."""
    if not row["available"]:
        return "not offered: missing " + ", ".join(row["missing"])
    return "offered" if row["in_prompt"] else "cut by the prompt budget"


@quiet_logs(level="error")  # skipped files are in the output
def show_skill(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    skill = _catalog(args, loaded).scan().skills.get(args.name)
    if skill is None:
        print(f"error: no skill named {args.name!r}", file=sys.stderr)
        return 1
    if args.json:
        print_json({**skill.as_dict(), "body": skill.body})
        return 0
    print(f"{skill.name} ({skill.source}) — {skill.description}\n{skill.path}")
    if skill.missing:
        print(f"not offered: missing {', '.join(skill.missing)}")
    print(f"\n{skill.body}")
    return 0


@quiet_logs(level="error")  # skipped files are in the output
def check_skills(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    catalog = _catalog(args, loaded)
    scan = catalog.scan()
    section = catalog.section()
    out: dict[str, Any] = {"diagnostics": scan.diagnostics, "skills": len(scan.skills),
                           "in_prompt": len(section.included), "prompt_chars": len(section.text),
                           "cut_by_count": section.cut_by_count,
                           "cut_by_chars": section.cut_by_chars}
    if args.json:
        print_json(out)
    else:
        for line in scan.diagnostics:
            print(f"diagnostic: {line}")
        print(f"{out['skills']} skills, {out['in_prompt']} in the prompt "
              f"({out['prompt_chars']} chars); cut by count {section.cut_by_count}, by "
              f"characters {section.cut_by_chars}")
    return 1 if scan.diagnostics else 0


@quiet_logs(level="error")  # skipped files are in the output
def install_skill(args: argparse.Namespace, loaded: LoadedConfig) -> int:
    from gateway.tools.services import managed_skills_dir
    from runtime.skills.install import InstallError, install
    cfg = loaded.config
    try:
        done = install(args.path, managed_skills_dir(cfg, loaded.state_dir),
                       cfg.skills.max_file_bytes)
    except InstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"installed": [{"name": n, "path": str(p)} for n, p in done]})
    else:
        for name, path in done:
            print(f"installed {name} -> {path}")
    return 0


def register(sub: Any) -> None:
    s = sub.add_parser("skills", help="skills: list, show, check, install")
    ssub = s.add_subparsers(dest="skills_cmd", required=True)
    for name, func, help_text in (("list", list_skills, "every skill and its source"),
                                  ("check", check_skills, "skipped files, duplicates, budget")):
        p = ssub.add_parser(name, help=help_text)
        p.add_argument("--agent", help="agent id (default: the default agent)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)
    sh = ssub.add_parser("show", help="one skill's metadata and text")
    sh.add_argument("name", help="skill name")
    sh.add_argument("--agent", help="agent id (default: the default agent)")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=show_skill)
    ins = ssub.add_parser("install", help="install a skill directory, archive or git repo")
    ins.add_argument("path", help="a skill directory (with SKILL.md), an archive of one, or "
                                  "a git repository URL[#REF] (https, ssh, git, file, "
                                  "git@host:path, a local bare repository)")
    ins.add_argument("--json", action="store_true")
    ins.set_defaults(func=install_skill)
