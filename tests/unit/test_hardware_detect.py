"""Board recognition on faithful fake trees: every fixture board resolves to its profile."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from edgeagent.hardware.detect import detect, read_facts
from edgeagent.hardware.profile import ProfileError, load_profiles
from tests.support.hardware import FIXTURES

EXPECTED = {
    "jetson-orin": "jetson-orin",
    "jetson-xavier": "jetson-xavier",
    "jetson-nano": "jetson-nano",
    "raspberry-pi-4": "raspberry-pi-4",
    "raspberry-pi-5": "raspberry-pi-5",
    "rk3588": "rk3588",
    "intel-npu": "intel-npu",
    "coral-pcie": "coral",
    "generic-x86_64": "generic-x86_64",
    "generic-aarch64": "generic-aarch64",
    "garbled": "generic-aarch64",
    "conflict": "generic-aarch64",
}


@pytest.fixture(scope="module")
def profiles():
    return load_profiles()


def test_every_fixture_board_is_covered() -> None:
    assert {p.name for p in FIXTURES.iterdir()} == set(EXPECTED)


@pytest.mark.parametrize(("board", "expected"), sorted(EXPECTED.items()))
def test_board_resolves_to_its_profile(profiles, board: str, expected: str) -> None:
    detection = detect(profiles, read_facts(FIXTURES / board))
    assert detection.profile.name == expected, detection.reason


def test_jetson_facts_and_reason(profiles) -> None:
    facts = read_facts(FIXTURES / "jetson-orin")
    assert facts.arch == "aarch64"
    assert facts.tegra_release == "R36.4.3"
    assert facts.compatible[-1] == "nvidia,tegra234"
    assert facts.model.startswith("NVIDIA Jetson Orin Nano")
    assert "p3767" in facts.dts_filename
    assert "tj-thermal" in facts.thermal_zones
    detection = detect(profiles, facts)
    assert "files: etc/nv_tegra_release" in detection.reason
    assert "compatible: nvidia,tegra234" in detection.reason
    assert {"sensor": "zone", "name": "tj-thermal", "present": True} in detection.thermal_presence()
    xavier = next(r for r in detection.results if r.profile == "jetson-xavier")
    assert not xavier.matched and "compatible: none of nvidia,tegra194" in xavier.evidence


def test_intel_npu_is_found_by_its_driver_link(profiles) -> None:
    facts = read_facts(FIXTURES / "intel-npu")
    assert facts.arch == "x86_64" and "avx_vnni" in facts.cpu_flags
    assert facts.has_device("driver:accel:intel_vpu")
    assert not facts.has_device("driver:accel:rocket")
    assert facts.has_device("pci:8086:7d1d")
    assert "coretemp" in facts.hwmon
    detection = detect(profiles, facts)
    assert "driver:accel:intel_vpu" in detection.reason
    assert [t["present"] for t in detection.thermal_presence()] == [True, True]


def test_missing_thermal_sensors_are_visible(profiles) -> None:
    detection = detect(profiles, read_facts(FIXTURES / "coral-pcie"))
    assert detection.thermal_presence() == [{"sensor": "apex", "name": "apex_0", "present": True}]
    generic = detect(profiles, read_facts(FIXTURES / "generic-x86_64"))
    assert {t["name"]: t["present"] for t in generic.thermal_presence()} == {
        "coretemp": False,
        "k10temp": True,
    }


def test_accessories_present_are_reported(profiles) -> None:
    pi5 = detect(profiles, read_facts(FIXTURES / "raspberry-pi-5"))
    assert len(pi5.accessories) == 1 and "Hailo-8L" in pi5.accessories[0]
    pi4 = detect(profiles, read_facts(FIXTURES / "raspberry-pi-4"))
    assert any("Coral USB" in a for a in pi4.accessories)


def test_coral_usb_on_a_plain_pc(profiles, tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cpuinfo").write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    usb = tmp_path / "sys/bus/usb/devices/1-2"
    usb.mkdir(parents=True)
    (usb / "idVendor").write_text("1a6e\n")
    (usb / "idProduct").write_text("089a\n")
    detection = detect(profiles, read_facts(tmp_path))
    assert detection.profile.name == "coral"
    assert "usb:1a6e:089a" in detection.reason


def test_garbled_files_fall_back_with_notes(profiles) -> None:
    facts = read_facts(FIXTURES / "garbled")
    assert facts.compatible == ()
    assert facts.model == ""
    assert facts.thermal_zones == ()
    assert any("garbled entry" in n for n in facts.notes)
    assert any("nv_tegra_release" in n for n in facts.notes)
    detection = detect(profiles, facts)
    assert detection.profile.generic
    assert "no specific profile matched" in detection.reason


def test_conflicting_evidence_is_logged_and_falls_back(profiles, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="edgeagent.hardware.detect"):
        detection = detect(profiles, read_facts(FIXTURES / "conflict"))
    assert detection.profile.name == "generic-aarch64"
    assert "conflicting evidence" in detection.reason
    assert "raspberry-pi-5" in detection.reason and "rk3588" in detection.reason
    assert "conflicting evidence" in caplog.text


def test_empty_root_uses_host_arch_and_generic(profiles, tmp_path: Path) -> None:
    facts = read_facts(tmp_path)
    assert any("architecture taken from this host" in n for n in facts.notes)
    assert detect(profiles, facts).profile.generic


def test_unreadable_file_is_a_note_not_a_crash(profiles, tmp_path: Path) -> None:
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").mkdir()  # a directory where a file belongs: EISDIR
    (tmp_path / "proc/cpuinfo").write_text("Features\t: fp asimd\nCPU architecture: 8\n")
    facts = read_facts(tmp_path)
    assert facts.model == "" and any("unreadable" in n for n in facts.notes)


def test_forced_profile_and_unknown_name(profiles) -> None:
    facts = read_facts(FIXTURES / "generic-x86_64")
    assert detect(profiles, facts, forced="coral").profile.name == "coral"
    with pytest.raises(ProfileError, match="no profile named 'nope'"):
        detect(profiles, facts, forced="nope")


def test_fixture_driver_link_is_a_symlink() -> None:
    link = FIXTURES / "intel-npu/sys/class/accel/accel0/device/driver"
    assert os.readlink(link).endswith("/intel_vpu")


def test_model_and_cpu_flag_evidence(tmp_path: Path) -> None:
    shipped = load_profiles()
    (tmp_path / "pi5-vnni.toml").write_text(
        'name = "pi5-vnni"\narch = "aarch64"\npriority = 200\n[match]\n'
        'model = ["Raspberry Pi 5"]\ncpu_flags = ["asimddp", "i8mm"]\n'
        '[[candidate]]\nruntime = "litert"\ndevice = "CPU"\nprecision = "int8"\n'
    )
    profiles = [*shipped, *load_profiles(tmp_path)]
    detection = detect(profiles, read_facts(FIXTURES / "raspberry-pi-5"))
    assert detection.profile.name == "pi5-vnni"
    assert detection.reason == "model: Raspberry Pi 5; cpu_flags: asimddp"
    nano = detect(profiles, read_facts(FIXTURES / "jetson-nano"))  # its cpuinfo lacks asimddp
    assert nano.profile.name == "jetson-nano"
