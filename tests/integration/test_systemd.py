"""The systemd unit: verified by systemd-analyze, and carrying the promised settings (SPEC §10)."""

from __future__ import annotations

import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.helpers import REPO

UNIT = REPO / "edgeagent" / "systemd" / "edgeagent.service"  # package data; systemd/ links here


def directives(text: str) -> dict[str, list[str]]:
    """Key → values (systemd units repeat keys such as DeviceAllow)."""
    found: dict[str, list[str]] = defaultdict(list)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found[key.strip()].append(value.strip())
    return found


def test_unit_has_notify_watchdog_directories_and_hardening():
    unit = directives(UNIT.read_text())
    expected = {
        "Type": "notify",
        "User": "edgeagent",
        "Group": "edgeagent",
        "RuntimeDirectory": "edgeagent",
        "StateDirectory": "edgeagent",
        "ConfigurationDirectory": "edgeagent",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "DevicePolicy": "closed",
        "RestartPreventExitStatus": "2",
        "PrivateMounts": "yes",
        "IPAddressDeny": "any",
        "IPAddressAllow": "localhost",
        "ExecReload": "/bin/kill -HUP $MAINPID",
    }
    for key, value in expected.items():
        assert unit.get(key) == [value], key
    assert int(unit["WatchdogSec"][0]) > 0
    assert unit["ExecStart"][0].endswith("edgeagent run")
    allowed = " ".join(unit["DeviceAllow"])
    for family in (
        "char-drm",
        "char-accel",
        "char-nvidia*",
        "char-nvhost*",
        "char-apex",
        "char-hailo*",
    ):
        assert family in allowed
    # a group missing on the board would stop the unit: the installer's drop-in names them
    assert "SupplementaryGroups" not in unit
    assert unit["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    # the socket's group access (0660) relies on the unit's umask not removing group bits
    assert unit["UMask"] == ["0007"]


def test_sysusers_creates_the_dedicated_user():
    line = (UNIT.parent / "edgeagent.sysusers").read_text().splitlines()[-1].split()
    assert line[:2] == ["u", "edgeagent"]


def test_systemd_analyze_verify_reports_nothing(tmp_path: Path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd)")
    # verify also checks that ExecStart exists; point it at a binary this machine has.
    unit = tmp_path / "edgeagent.service"
    unit.write_text(UNIT.read_text().replace("/opt/edgeagent/bin/edgeagent", "/bin/true"))
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    # verify exits 0 even for unknown keys or bad values; its warnings are the verdict.
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr
    broken = tmp_path / "broken.service"
    broken.write_text(unit.read_text().replace("Type=notify", "Type=notfy"))
    result = subprocess.run(
        [analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60
    )
    assert "notfy" in result.stderr  # the check above can fail


def test_security_exposure_is_at_most_the_recorded_score(tmp_path: Path):
    """`systemd-analyze security` of the unit as shipped and with the installer's drop-in."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd)")
    dropin = "[Service]\nSupplementaryGroups=render video\nIPAddressAllow=192.0.2.10\n"
    for text, limit in ((UNIT.read_text(), 1.3), (UNIT.read_text() + dropin, 1.5)):
        unit = tmp_path / "edgeagent.service"
        unit.write_text(text)
        result = subprocess.run(
            [analyze, "security", "--offline=yes", str(unit)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if "Unknown option" in result.stderr or "unrecognized option" in result.stderr:
            pytest.skip("this systemd-analyze has no --offline (systemd < 252)")
        score = float(
            result.stdout.rsplit("exposure level for edgeagent.service:", 1)[1].split()[0]
        )
        assert score <= limit, result.stdout


def test_the_unit_shows_how_to_pass_the_tokens_as_credentials():
    """Commented LoadCredential= lines whose names are the ones the agent reads."""
    from edgeagent.api.secret_files import ADMIN_TOKEN_CREDENTIAL, TOKEN_CREDENTIAL

    text = UNIT.read_text()
    for name in (TOKEN_CREDENTIAL, ADMIN_TOKEN_CREDENTIAL):
        assert f"\n#LoadCredential={name}:/etc/edgeagent/" in text, name
    assert "LoadCredential" not in directives(text)  # shown, not imposed
