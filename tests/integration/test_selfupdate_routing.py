"""The updater routes an agent release by its kind (issue 27), before any model check runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from edgeagent.fleet.agent_manifest import this_platform
from edgeagent.hub.agent_release import sign_agent_release
from edgeagent.hub.keys import keygen
from tests.integration.test_updates_helpers import make_device
from tests.unit.test_selfupdate import _wheels


async def test_an_agent_release_goes_to_the_self_updater_only(tmp_path: Path) -> None:
    keygen(tmp_path / "keys", agent_keys=1)
    envelope = sign_agent_release(
        {this_platform(): _wheels(tmp_path / "wh", "9.0.0")},
        key_paths=[tmp_path / "keys" / "agent.key"],
        base_url="http://127.0.0.1:9",
        out_dir=tmp_path / "out",
    ).read_bytes()
    with ThreadPoolExecutor(2) as executor:
        device = make_device(tmp_path / "device", tmp_path / "keys" / "trust.json", executor)
        try:
            on_model_slot = await device.updater.apply(envelope, "edgeagent/group/lab/release/tiny")
            assert on_model_slot["code"] == "wrong_topic", on_model_slot
            without_root = await device.updater.apply(envelope)  # [updates] agent_root unset
            assert without_root["code"] == "self_update_off", without_root
            assert device.store.models() == [] and device.store.pending() is None
        finally:
            await device.registry.close()
