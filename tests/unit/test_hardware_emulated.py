"""Board facts when the process's architecture is not the one /proc/cpuinfo describes.

Under qemu user emulation (an arm64 container built or tested on an x86_64 host through
binfmt_misc, as scripts/test-arm64.sh does) the kernel's /proc/cpuinfo is the host's: x86 flags,
no ``Features``. The agent then picked generic-x86_64 and its x86 candidates on an aarch64
interpreter. On the live tree the running interpreter's architecture is what the runtimes and
wheels are built for, so it wins; a fake tree (tests, --board-root) keeps its own cpuinfo.
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from edgeagent.hardware.detect import detect, read_facts
from edgeagent.hardware.profile import load_profiles
from tests.support.hardware import FIXTURES


def test_an_emulated_interpreter_overrides_the_hosts_cpuinfo() -> None:
    facts = read_facts(FIXTURES / "generic-x86_64", machine="aarch64")
    assert facts.arch == "aarch64"
    assert not facts.cpu_flags  # the host's avx2 says nothing about the emulated CPU
    assert any("emulat" in note and "x86_64" in note for note in facts.notes)
    assert detect(load_profiles(), facts).profile.name == "generic-aarch64"


def test_a_matching_interpreter_keeps_the_trees_flags() -> None:
    facts = read_facts(FIXTURES / "raspberry-pi-5", machine="arm64")  # uname spelling
    assert facts.arch == "aarch64" and "asimddp" in facts.cpu_flags
    assert not any("emulat" in note for note in facts.notes)


def test_a_fake_tree_is_read_as_it_is_without_a_machine() -> None:
    facts = read_facts(FIXTURES / "generic-x86_64")
    assert facts.arch == "x86_64" and "avx2" in facts.cpu_flags


def test_the_live_tree_takes_the_running_interpreters_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The live / on an x86_64 host seen by an aarch64 interpreter: qemu-user's situation.

    platform.machine() is the one thing replaced, by the answer an emulated interpreter gives
    (this machine has no Arm CPU); /proc/cpuinfo is the real one.
    """
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    facts = read_facts(Path("/"))
    assert facts.arch == "aarch64"
    assert "avx2" not in facts.cpu_flags
