"""``status`` and ``agent`` reach a gateway running on the last-known-good config even when
the file's YAML or ``gateway`` section is broken (the case that makes the gateway use the
copy): through the copy's ``gateway`` section, with a note saying so."""

from __future__ import annotations

import json

import yaml

from tests.channel_harness import run_cli
from tests.helpers import base_config, running_gateway


async def test_status_reaches_the_gateway_through_the_lkg_copy(tmp_path):
    state = tmp_path / "state"
    cfg = base_config(state, config={"on_invalid": "lkg"})
    path = state / "config.yaml"  # in the state dir: found without a gateway section
    async with running_gateway(cfg):
        (state / "config.lkg.yaml").write_text(yaml.safe_dump(cfg))
        for broken in ("gateway: [unclosed\n",  # unparseable YAML
                       yaml.safe_dump({**cfg, "gateway": {**cfg["gateway"], "port": "abc"}})):
            path.write_text(broken)
            code, out, err = await run_cli(path, "status", "--json")
            assert code == 0, err
            assert json.loads(out)["running"] is True
            assert "the gateway section of the last-known-good config" in err
            assert str(state / "config.lkg.yaml") in err
            code, out, err = await run_cli(path, "gateway", "status")
            assert code == 0, err
        (state / "config.lkg.yaml").unlink()  # no copy: the file's error, exit 2
        code, _, err = await run_cli(path, "status")
        assert code == 2 and "invalid config" in err
