"""``backup.schedule`` applies on reload (SIGHUP) at once: adding one starts the
scheduled backups, removing one stops them, changing one moves the next slot now."""

from __future__ import annotations

from gateway.config.load import parse_config
from runtime.clock import FakeClock
from tests.helpers import base_config, running_gateway

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def _backups(gw) -> list[str]:
    folder = gw.state_dir / "backups"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


async def test_schedule_changes_by_reload_apply_at_once(tmp_path):
    clock = FakeClock(T0)
    cfg = base_config(tmp_path / "state")
    async with running_gateway(cfg, clock=clock) as gw:
        await gw.local.send("hello")

        async def reload(schedule):
            new = {**cfg, "backup": {"schedule": schedule, "keep": 5}}
            assert await gw.reload(parse_config(new, "test", env={})) == []
            return gw.status()["backup"]["next_at"]

        assert await reload("*/10 * * * *") == "2026-01-01T00:10:00.000Z"  # added
        gw.backup.ran.clear()
        await clock.advance(600)
        await gw.backup.ran.wait()
        assert _backups(gw) == ["tidegate-backup-20260101T001000Z.tar.gz"]

        assert await reload(None) is None  # removed: no further backup
        await clock.advance(1800)
        assert len(_backups(gw)) == 1

        assert await reload("*/10 * * * *") == "2026-01-01T00:50:00.000Z"  # back again
        gw.backup.ran.clear()
        await clock.advance(600)
        await gw.backup.ran.wait()
        assert _backups(gw)[-1] == "tidegate-backup-20260101T005000Z.tar.gz"

        # changed: the next slot is the new expression's, not one more at the old one
        assert await reload("0 3 * * *") == "2026-01-01T03:00:00.000Z"
        await clock.advance(600)
        assert len(_backups(gw)) == 2


def test_rotation_in_a_shared_backup_dir_deletes_only_this_gateways(tmp_path):
    """Two gateways share one backup.dir: each rotates its own scheduled backups (by the
    manifest's state dir), never the other's, nor a file whose manifest is unreadable."""
    from gateway.backup.archive import create_backup
    from gateway.backup.service import rotate
    shared = tmp_path / "shared"
    states = {}
    for name in ("a", "b"):
        states[name] = tmp_path / name
        (states[name] / "agents").mkdir(parents=True)
        (states[name] / "agents" / "x.txt").write_text(name)
    names = {("a", 1): "20260101T000000Z", ("b", 1): "20260101T000500Z",
             ("a", 2): "20260101T001000Z", ("b", 2): "20260101T001500Z",
             ("a", 3): "20260101T002000Z"}
    for (who, _), stamp in names.items():
        create_backup(states[who], shared / f"tidegate-backup-{stamp}.tar.gz",
                      scheduled=True)  # as the schedule makes them
    (shared / "tidegate-backup-20250101T000000Z.tar.gz").write_bytes(b"damaged")
    gone = rotate(shared, 1, states["a"])
    assert sorted(p.name for p in gone) == ["tidegate-backup-20260101T000000Z.tar.gz",
                                            "tidegate-backup-20260101T001000Z.tar.gz"]
    assert sorted(p.name for p in shared.iterdir()) == [
        "tidegate-backup-20250101T000000Z.tar.gz", "tidegate-backup-20260101T000500Z.tar.gz",
        "tidegate-backup-20260101T001500Z.tar.gz", "tidegate-backup-20260101T002000Z.tar.gz"]


def test_a_telemetry_change_by_reload_is_reported_as_restart_required(tmp_path):
    from gateway.config.reload import restart_required
    cfg = base_config(tmp_path / "state")
    old = parse_config(cfg, "test", env={}).config
    new = parse_config({**cfg, "telemetry": {"otlp": {"endpoint": "http://127.0.0.1:9"}}},
                       "test", env={}).config
    assert restart_required(old, new) == ["telemetry"]
    backup = parse_config({**cfg, "backup": {"schedule": "@daily"}}, "test", env={}).config
    assert restart_required(old, backup) == []  # applied live (reconfigure)
