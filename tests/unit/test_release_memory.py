"""The updater's memory of releases, on its own: hints per topic, handled and committed
envelopes that survive a restart, and a newer commit that makes the older one a replay."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from edgeagent.updates.release_memory import REMEMBERED, ReleaseMemory, handled_key


def test_a_newer_hint_replaces_what_waited_on_its_topic_and_goes_to_the_back() -> None:
    async def drain(memory: ReleaseMemory) -> list[tuple[str, bytes]]:
        return [await memory.next_hint() for _ in range(memory.queued)]

    memory = ReleaseMemory(Path("/nonexistent"))
    memory.hint("a", b"1")
    memory.hint("b", b"2")
    memory.hint("a", b"3")
    assert memory.queued == 2
    assert asyncio.run(drain(memory)) == [("b", b"2"), ("a", b"3")]
    assert memory.queued == 0


def test_keys_differ_by_purpose() -> None:
    assert handled_key("trust", b"x") != handled_key("release", b"x")
    assert handled_key("release", b"x") == handled_key("release", b"x")


def test_handled_and_committed_envelopes_survive_a_restart(tmp_path: Path) -> None:
    memory = ReleaseMemory(tmp_path)
    memory.remember("release:v1")
    memory.supersede("tiny", "release:v1")
    again = ReleaseMemory(tmp_path)
    assert again.handled("release:v1")
    memory.remember("release:v2")
    memory.supersede("tiny", "release:v2")  # v1 is a replay now: refused, not skipped
    again = ReleaseMemory(tmp_path)
    assert not again.handled("release:v1") and again.handled("release:v2")


def test_only_the_latest_envelopes_are_remembered(tmp_path: Path) -> None:
    memory = ReleaseMemory(tmp_path)
    for n in range(REMEMBERED + 1):
        memory.remember(f"release:{n}")
    assert not memory.handled("release:0") and memory.handled(f"release:{REMEMBERED}")


def test_unreadable_state_files_start_empty(tmp_path: Path) -> None:
    (tmp_path / "handled.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "committed-envelopes.json").write_text("[1, 2]", encoding="utf-8")
    memory = ReleaseMemory(tmp_path)
    assert not memory.handled("release:x")
    memory.supersede("tiny", "release:x")  # writes a fresh record over the bad one
    assert json.loads((tmp_path / "committed-envelopes.json").read_text()) == {"tiny": "release:x"}
