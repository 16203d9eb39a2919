"""Issue 27: which devices an agent release goes to (their reported platform and Python), and
the state report that tells the hub — no broker, no database."""

from __future__ import annotations

import json

from edgeagent.fleet.agent_manifest import this_platform, this_python
from edgeagent.fleet.messages import decode_state
from edgeagent.hub.server.reports import state_columns
from edgeagent.hub.server.targets import MAX_LEFT_OUT_REASONS, agent_devices, left_out_text
from edgeagent.updates.report import UpdateReporter

RELEASE = {"platforms": ["linux_x86_64", "linux_aarch64"], "python": "3.11"}


def test_only_devices_of_a_covered_platform_and_python_are_kept() -> None:
    found = [
        ("a", "linux_x86_64", "3.11"),
        ("b", "linux_aarch64", "3.11"),
        ("c", "linux_armv7l", "3.11"),
        ("d", "linux_aarch64", "3.12"),
        ("e", "", ""),  # an agent from before self-updates reports neither
        ("f", "linux_x86_64", ""),
    ]
    kept, left_out = agent_devices(RELEASE, found)
    assert kept == ["a", "b"]
    assert left_out == {
        "devices": 4,
        "reasons": {
            "reports no platform or Python (an agent without self-updates)": 2,
            "platform linux_armv7l: no wheelhouse in this release": 1,
            "Python 3.12: the release's wheels are for Python 3.11": 1,
        },
    }
    assert left_out_text(left_out).startswith("2 reports no platform or Python")


def test_the_reasons_named_are_bounded_and_the_rest_counted() -> None:
    found = [(f"dev-{i}", f"linux_board{i}", "3.11") for i in range(MAX_LEFT_OUT_REASONS + 5)]
    kept, left_out = agent_devices(RELEASE, [*found, ("ok", "linux_x86_64", "3.11")])
    assert kept == ["ok"]
    assert left_out["devices"] == MAX_LEFT_OUT_REASONS + 5
    assert len(left_out["reasons"]) == MAX_LEFT_OUT_REASONS + 1
    assert left_out["reasons"]["other platforms or Pythons"] == 5


def test_the_state_report_carries_the_platform_and_python_the_hub_stores() -> None:
    reporter = UpdateReporter("dev-1", "lab")
    report = decode_state(json.dumps(reporter.state()).encode())
    assert (report.platform, report.python) == (this_platform(), this_python())
    values = state_columns(report).values
    assert (values["platform"], values["python"]) == (this_platform(), this_python())
    old = state_columns(decode_state(b'{"device_id": "dev-1", "agent_version": "0.1.0"}'))
    assert (old.values["platform"], old.values["python"]) == ("", "")  # an older agent's
