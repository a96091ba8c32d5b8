"""What the gateway's start no longer pays for (issue 9, cold start to the first answer):
signature inspection of config-field default factories, pydantic plugin discovery and
garbage collections while the command line and the daemon's modules are imported.

Each check runs in a fresh interpreter, instruments the library call in question and
reports what happened as JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.helpers import ROOT


def _child(script: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


FACTORIES = """
    import json
    import pydantic._internal._generate_schema as gen
    seen = []
    inspect = gen.takes_validated_data_argument
    def recording(factory):
        seen.append(factory)
        return inspect(factory)
    gen.takes_validated_data_argument = recording
    from gateway.config.schema import Config
    cfg = Config.model_validate({})
    print(json.dumps({
        "types": sorted(getattr(f, "__qualname__", repr(f)) for f in seen
                        if isinstance(f, type)),
        "inspected": len(seen),
        "tools_deny": cfg.tools.deny, "web": type(cfg.tools.web).__name__}))
"""


def test_config_classes_need_no_factory_signature_inspection():
    """``Field(default_factory=list)`` or ``=SomeModel`` makes pydantic inspect the
    factory's signature while building the class (``list``'s costs ~0.5 ms: its text
    signature is parsed with ``ast``); the config models use copied ``[]``/``{}``
    defaults and ``section()`` instead, with the same validated result."""
    got = _child(FACTORIES)
    assert got["types"] == []  # before: 27 × list plus 50 model classes
    assert got["inspected"] <= 2  # the one remaining lambda (subagent tool defaults)
    assert got["tools_deny"] == [] and got["web"] == "WebSettings"


def test_mutable_config_defaults_are_not_shared_between_configs():
    got = _child("""
        import json
        from gateway.config.schema import Config
        a, b = Config.model_validate({}), Config.model_validate({})
        a.tools.deny.append("exec")
        a.bindings.append(None)
        a.channels.telegram.accounts["x"] = None
        print(json.dumps({"deny": b.tools.deny, "bindings": b.bindings,
                          "accounts": list(b.channels.telegram.accounts),
                          "same_section": a.tools is b.tools}))
    """)
    assert got == {"deny": [], "bindings": [], "accounts": [], "same_section": False}


START = """
    import gc, json, os, sys
    import importlib.metadata as md
    scans, seen = [], {}
    real = md.distributions
    def distributions(*a, **k):  # what pydantic's plugin search (entry_points) iterates
        scans.append(1)
        return real(*a, **k)
    md.distributions = distributions

    class Watch:  # records whether the GC was on as each module is first looked up
        def find_spec(self, name, path=None, target=None):
            seen.setdefault(name, gc.isenabled())
    sys.meta_path.insert(0, Watch())
    import argparse
    built, add_parser = [], argparse._SubParsersAction.add_parser
    def recording_add_parser(self, name, **kw):
        built.append(name)
        return add_parser(self, name, **kw)
    argparse._SubParsersAction.add_parser = recording_add_parser
    import gateway.cli
    gc_after_cli = gc.isenabled()
    code = gateway.cli.main(["gateway", "--config", sys.argv[1]])  # exits 2: bad key
    from pydantic.plugin import _loader
    print(json.dumps({"gc_after_cli": gc_after_cli, "code": code, "scans": scans,
                      "seen": seen, "parsers": built, "plugins": _loader._plugins,
                      "env": os.environ.get("PYDANTIC_DISABLE_PLUGINS")}))
"""

WATCHED = ["gateway.cli.main", "gateway.config.load", "pydantic", "gateway.service.run",
           "channels.config", "gateway.config.schema", "aiohttp.web"]


def test_gateway_start_imports_without_gc_passes_or_pydantic_plugin_scan(tmp_path):
    """``import gateway.cli`` and the daemon's own imports run with the cyclic GC paused
    (on again afterwards), and pydantic never reads every installed distribution's entry
    points to look for plugins, not even for the models built when the config is validated
    after the imports. ``tidegate gateway`` builds the argparse parsers of its own command
    only."""
    bad = tmp_path / "config.yaml"
    bad.write_text("gateway:\n  prot: 1\n")  # the config is read after the imports
    got = _child(START, str(bad))
    assert got["code"] == 2
    states = {name: got["seen"].get(name) for name in WATCHED}
    assert states == dict.fromkeys(WATCHED, False)  # before: GC on
    assert got["gc_after_cli"] is True
    assert got["scans"] == []  # before: one search, at the first model built
    assert got["plugins"] == {}  # "none", as pydantic keeps a finished search
    assert got["env"] is None  # the environment subprocesses inherit is unchanged
    # the daemon's argparse tree is its own command only (before: all ~40 commands)
    assert got["parsers"] == ["gateway", "status", "stop", "reload", "restart"]


def test_a_pydantic_plugin_setting_of_the_operator_is_kept():
    """An operator who set ``PYDANTIC_DISABLE_PLUGINS`` gets pydantic's own handling of
    it: the value is left alone and pydantic's plugin list is not preset."""
    script = ("import os, gateway.cli; from pydantic.plugin import _loader; "
              "print(os.environ['PYDANTIC_DISABLE_PLUGINS'], _loader._plugins)")
    env = {**os.environ, "PYDANTIC_DISABLE_PLUGINS": "logfire"}
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["logfire", "None"]


def test_version_alone_imports_neither_the_parser_nor_the_libraries():
    """``tidegate --version`` (also after ``--config X``) prints the version from the
    installed metadata and imports none of the command tree, pydantic or aiohttp
    (before: ~0.75 s of CPU building the whole command line to print one line)."""
    from importlib.metadata import version
    for argv in (["--version"], ["--config", "/nonexistent.yaml", "--version"]):
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "gateway.cli", *argv],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"tidegate {version('tidegate')}\n"
        imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "importlib.metadata" in imported  # the listing is real
        heavy = {"aiohttp", "pydantic", "gateway.cli.main", "gateway.config.load",
                 "structlog", "yaml"}
        assert not heavy & imported, heavy & imported
    # a subcommand still gets the full command line
    r = subprocess.run([sys.executable, "-m", "gateway.cli", "config", "--version"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "usage: tidegate config" in r.stderr and not r.stdout
