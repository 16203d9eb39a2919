"""Device profile schema: the shipped profiles load, and every mistake names the file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.hardware.profile import (
    ProfileError,
    board_profiles,
    load_profile,
    load_profiles,
)
from edgeagent.paths import shipped_profiles_dir

VALID = """
name = "board"
arch = "aarch64"
priority = 10
[match]
compatible = ["vendor,board"]
[threads]
intra_op = 4
[[candidate]]
runtime = "litert"
device = "CPU"
precision = "int8"
power = "low"
[[thermal.zone]]
sensor = "zone"
name = "cpu-thermal"
warm_c = 70.0
hot_c = 80.0
critical_c = 90.0
[power]
budget_w = 12.5
[[power.sensor]]
kind = "hwmon"
name = "ina219"
total = true
[battery]
supply = "BAT0"
"""

SHIPPED = {
    "jetson-orin", "jetson-xavier", "jetson-nano", "raspberry-pi-4", "raspberry-pi-5", "rk3588",
    "intel-npu", "coral", "generic-x86_64", "generic-aarch64",
}  # fmt: skip


def _write(tmp_path: Path, text: str, name: str = "board") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_every_shipped_profile_loads_with_candidates_and_sensors() -> None:
    profiles = {p.name: p for p in load_profiles()}
    assert set(profiles) == SHIPPED
    for profile in profiles.values():
        assert profile.candidates, profile.name
        assert profile.source.parent == shipped_profiles_dir()
    assert {p.arch for p in profiles.values() if p.generic} == {"x86_64", "aarch64"}
    orin = profiles["jetson-orin"]
    assert orin.candidates[0].key == "onnxruntime:TensorrtExecutionProvider:fp16"
    assert orin.candidates[0].options["trt_engine_cache_enable"] is True
    assert orin.thermal[0].name == "tj-thermal"
    assert any(s.total and s.name == "VDD_IN" for s in orin.power_sensors)
    assert profiles["raspberry-pi-5"].throttle_command == "vcgencmd get_throttled"
    assert "Hailo" in profiles["raspberry-pi-5"].accessories[0].name
    assert profiles["jetson-nano"].power_budget_w == 10.0
    assert profiles["generic-x86_64"].battery is not None


def test_a_valid_profile_becomes_frozen_dataclasses(tmp_path: Path) -> None:
    profile = load_profile(_write(tmp_path, VALID))
    assert profile.threads == 4
    assert profile.candidates[0].key == "litert:CPU:int8"
    assert profile.thermal[0].hot_c == 80.0
    assert profile.power_budget_w == 12.5
    assert profile.battery is not None and profile.battery.low_percent == 20.0
    with pytest.raises(AttributeError):
        profile.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('name = "board"', 'name = "other"'), r"name: 'other' must equal the file name"),
        (
            ('runtime = "litert"', 'runtime = "tensorflow"'),
            r"candidate\[0\]\.runtime: 'tensorflow'",
        ),
        (('precision = "int8"', 'precision = "int4"'), r"candidate\[0\]\.precision"),
        (('power = "low"', 'power = "medium"'), r"candidate\[0\]\.power"),
        (("hot_c = 80.0", "hot_c = 95.0"), r"thermal\.zone\[0\]\.hot_c: limits must rise"),
        (("warm_c = 70.0", 'warm_c = "hot"'), r"thermal\.zone\[0\]\.warm_c: must be a number"),
        (('sensor = "zone"', 'sensor = "i2c"'), r"thermal\.zone\[0\]\.sensor"),
        (('kind = "hwmon"', 'kind = "shunt"'), r"power\.sensor\[0\]\.kind"),
        (("budget_w = 12.5", "budget_w = -1"), r"power\.budget_w: must be positive"),
        (("intra_op = 4", "intra_op = 0"), r"threads\.intra_op: must be at least 1"),
        (('arch = "aarch64"', 'arch = "riscv"'), r"arch: 'riscv' is not one of"),
        (('compatible = ["vendor,board"]', "compatible = []"), r"match: a non-generic profile"),
        (('compatible = ["vendor,board"]', 'devices = ["/dev/x"]'), r"match\.devices: '/dev/x'"),
        (('compatible = ["vendor,board"]', 'devices = ["usb:18d1"]'), r"must be usb:A:B"),
        (("[battery]", "[battery]\nvoltage = 3"), r"battery\.voltage: unknown key"),
        (("priority = 10", "priority = 10\ncolour = 1"), r"colour: unknown key"),
        (("priority = 10", "priorty = 10"), r"priorty: unknown key \(did you mean priority\?\)"),
        (('device = "CPU"', 'device = ""'), r"candidate\[0\]\.device: must not be empty"),
    ],
)
def test_bad_values_name_file_and_key(tmp_path: Path, change, message) -> None:
    path = _write(tmp_path, VALID.replace(*change))
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(path) in str(info.value)


def test_duplicate_candidate_and_missing_candidates(tmp_path: Path) -> None:
    block = VALID[VALID.index("[[candidate]]") : VALID.index("[[thermal.zone]]")]
    doubled = VALID.replace(block, block + block)
    with pytest.raises(ProfileError, match="litert:CPU:int8 is listed twice"):
        load_profile(_write(tmp_path, doubled))
    with pytest.raises(ProfileError, match=r"candidate: at least one \[\[candidate\]\]"):
        load_profile(_write(tmp_path, VALID.replace(block, "")))


def test_unreadable_files_and_directories(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(_write(tmp_path, "name = [unclosed"))
    garbage = tmp_path / "bin.toml"
    garbage.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(ProfileError, match="bin.toml: cannot read profile"):
        load_profile(garbage)
    with pytest.raises(ProfileError, match="does not exist"):
        load_profiles(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProfileError, match="no \\*.toml profiles"):
        load_profiles(tmp_path / "empty")


def test_an_operator_directory_adds_to_and_overrides_the_shipped_profiles(tmp_path: Path) -> None:
    _write(tmp_path, VALID)
    coral = (shipped_profiles_dir() / "coral.toml").read_text()
    _write(tmp_path, coral.replace("priority = 60", "priority = 61"), "coral")
    profiles = {p.name: p for p in board_profiles(tmp_path)}
    assert set(profiles) == SHIPPED | {"board"}
    assert profiles["coral"].source == tmp_path / "coral.toml"
    assert profiles["coral"].priority == 61
    assert profiles["jetson-orin"].source.parent == shipped_profiles_dir()
