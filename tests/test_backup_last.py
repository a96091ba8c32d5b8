"""A damaged ``backup-last.json`` (a hand edit, a bad disk) disables only the backup
report: /status, /metrics and doctor still answer, and say the result is unknown, naming
the file."""

from __future__ import annotations

import pytest

from gateway.cli.doctor import check_backup
from tests.helpers import base_config, running_gateway

BAD = ['{"at": "garbage", "ok": true}', '{"at": 17000', '[1, 2]', '{"at": 1e999, "ok": true}',
       '{"at": 1767225600, "ok": "yes"}', '{"at": 1767225600, "ok": true, "file": 3}']


@pytest.mark.parametrize("text", BAD)
def test_doctor_names_an_unusable_record(tmp_path, text):
    (tmp_path / "backup-last.json").write_text(text)
    [f] = check_backup({"state_dir": tmp_path, "loaded": None, "now": 1767225600.0})
    assert f.severity == "warning" and "result is unknown" in f.message
    assert str(tmp_path / "backup-last.json") in f.message


async def test_status_and_metrics_answer_with_an_unusable_record(tmp_path):
    cfg = base_config(tmp_path / "state")
    async with running_gateway(cfg) as gw:
        (gw.state_dir / "backup-last.json").write_text(BAD[0])
        status = gw.status()  # as GET /status builds it
        assert status["backup"]["ok"] is None and status["backup"]["last_at"] is None
        assert "backup-last.json cannot be used" in status["backup"]["problem"]
        assert any("last backup's result is unknown" in p for p in status["problems"])
        from gateway.cli.output import backup_line
        assert backup_line(status["backup"]).startswith("backup: unknown")
        text = gw.metrics.render().decode()
        assert "tidegate_backup_last_success 0.0" in text
        assert "tidegate_backup_last_timestamp_seconds" not in text.replace(
            "# HELP tidegate_backup_last_timestamp_seconds", "").replace(
            "# TYPE tidegate_backup_last_timestamp_seconds", "")
        made = await gw.backup.run_once()  # the next backup rewrites it
        assert made is not None and gw.status()["backup"]["problem"] is None
        assert gw.status()["backup"]["ok"] is True
