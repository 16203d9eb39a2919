"""Sensors read from fake sysfs trees of real boards: found by name, units right, and a sensor
that cannot be read is offline — never zero."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from edgeagent.governor import sysfs
from edgeagent.governor.power import Ina3221Rail, RaplDomain, parse_pmic, power_sensor
from edgeagent.governor.sensors import SensorSet
from edgeagent.governor.settings import GovernorSettings
from edgeagent.governor.supply import SupplyMonitor
from edgeagent.governor.sysfs import SensorOffline
from edgeagent.governor.thermal import temperature_sensor
from edgeagent.governor.throttled import PiThrottle, parse_throttled
from tests.fixtures.thermal.trees import battery, board, hwmon, power, write, zone


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_thermal_zone_found_by_type_not_index(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    sensor = temperature_sensor(root, zone("tj-thermal"))
    assert sensor.read() == pytest.approx(50.25)
    assert sensor.key == "zone:tj-thermal"
    # the kernel renumbers zones: the sensor follows the type, not the old index
    (root / "sys/class/thermal/thermal_zone4").rename(root / "sys/class/thermal/thermal_zone9")
    write(root, "sys/class/thermal/thermal_zone9/temp", 51000)
    assert sensor.read() == pytest.approx(51.0)
    assert {p["type"] for p in sensor.trip_points()} == {"passive", "critical"}


def test_jetson_powered_down_zone_is_offline_not_cold(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    with pytest.raises(SensorOffline, match="-256"):
        temperature_sensor(root, zone("gpu-thermal")).read()


def test_missing_zone_and_unreadable_attribute_are_offline(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    with pytest.raises(SensorOffline, match="no thermal zone of type 'nope'"):
        temperature_sensor(root, zone("nope")).read()
    temp = root / "sys/class/thermal/thermal_zone0/temp"
    temp.unlink()
    temp.mkdir()  # reading a directory fails with an OSError, like EINVAL from a driver
    with pytest.raises(SensorOffline, match="thermal_zone0/temp"):
        temperature_sensor(root, zone("cpu-thermal")).read()
    write(root, "sys/class/thermal/thermal_zone2/temp", "garbage")
    with pytest.raises(SensorOffline, match="not a number"):
        temperature_sensor(root, zone("cv0-thermal")).read()


def test_driver_errors_enodata_and_einval_are_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = board("jetson_orin", tmp_path)
    sensor = temperature_sensor(root, zone("cpu-thermal"))
    real_open = open
    for code in (errno.ENODATA, errno.EINVAL):

        def failing_open(path: Path, *args: object, code: int = code, **kwargs: object) -> object:
            if str(path).endswith("/temp"):  # the driver fails the value, not the zone's type
                raise OSError(code, "driver says no")
            return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(sysfs, "open", failing_open, raising=False)
        with pytest.raises(SensorOffline, match="driver says no"):
            sensor.read()
    monkeypatch.undo()
    assert sensor.read() == pytest.approx(48.5)


def test_hwmon_temperature_by_label_and_first_input(tmp_path: Path) -> None:
    root = board("intel_laptop", tmp_path)
    assert temperature_sensor(root, hwmon("coretemp", "Package id 0")).read() == 56.0
    assert temperature_sensor(root, hwmon("coretemp", "Core 0")).read() == 54.0
    assert temperature_sensor(root, hwmon("nvme")).read() == pytest.approx(38.85)
    with pytest.raises(SensorOffline, match="label 'Core 7'"):
        temperature_sensor(root, hwmon("coretemp", "Core 7")).read()


def test_apex_temperature(tmp_path: Path) -> None:
    write(tmp_path, "sys/class/apex/apex_0/temp", 45300)
    from edgeagent.hardware.profile import ThermalLimit

    sensor = temperature_sensor(tmp_path, ThermalLimit("apex", "apex_0", "", 80, 85, 95))
    assert sensor.read() == pytest.approx(45.3)
    with pytest.raises(SensorOffline, match="apex_1"):
        temperature_sensor(tmp_path, ThermalLimit("apex", "apex_1", "", 80, 85, 95)).read()


def test_ina3221_rails_skip_nc_and_sum_channel(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    rail = Ina3221Rail(root, "", total=True)
    assert set(rail.rails()) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC", "VDDQ_VDD2_1V8AO"}
    # the board total is the input rail: mV × mA
    assert rail.read() == pytest.approx(5.072 * 1.336)
    assert Ina3221Rail(root, "VDD_SOC", False).read() == pytest.approx(5.064 * 0.496)
    with pytest.raises(SensorOffline, match="NC"):
        Ina3221Rail(root, "NC", False).read()
    # a board without an input rail: the total is the sum of the connected rails
    (root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon3/in1_label").write_text("VDD_GPU\n")
    total = rail.read()
    expected = 5.072 * 1.336 + 5.064 * 0.320 + 5.064 * 0.496 + 5.0 * 0.120
    assert total == pytest.approx(expected)


def test_rapl_power_from_energy_counter_with_wrap(tmp_path: Path) -> None:
    root = board("intel_laptop", tmp_path)
    clock = Clock()
    sensor = RaplDomain(root, "package-0", True, clock)
    with pytest.raises(SensorOffline, match="two samples"):
        sensor.read()
    clock.now += 2.0
    write(root, "sys/class/powercap/intel-rapl:0/energy_uj", 1000000 + 30_000_000)
    assert sensor.read() == pytest.approx(15.0)
    # near the top of the range, then wrapped round to a small value: still 10 W, not negative
    top = 262143328850
    write(root, "sys/class/powercap/intel-rapl:0/energy_uj", top - 5_000_000)
    clock.now += 1.0
    sensor.read()
    write(root, "sys/class/powercap/intel-rapl:0/energy_uj", 5_000_000)
    clock.now += 1.0
    assert sensor.read() == pytest.approx(10.0)
    # a domain may also be named by its directory
    assert RaplDomain(root, "intel-rapl:0:0", False, clock)._domain().name == "intel-rapl:0:0"


def test_rapl_unreadable_counter_and_unknown_domain_are_offline(tmp_path: Path) -> None:
    root = board("intel_laptop", tmp_path)
    energy = root / "sys/class/powercap/intel-rapl:0/energy_uj"
    energy.unlink()  # since Linux 5.10 energy_uj is root-only: unreadable, like here
    with pytest.raises(SensorOffline, match="intel-rapl:0/energy_uj"):
        RaplDomain(root, "package-0", True).read()
    with pytest.raises(SensorOffline, match="no RAPL domain 'dram'"):
        RaplDomain(root, "dram", True).read()


def test_hwmon_power_in_microwatts(tmp_path: Path) -> None:
    write(tmp_path, "sys/class/hwmon/hwmon0/name", "rk805")
    write(tmp_path, "sys/class/hwmon/hwmon0/power1_input", 4_250_000)
    sensor = power_sensor(tmp_path, power("hwmon", "rk805"), pmic_command="", timeout_s=1)
    assert sensor.read() == pytest.approx(4.25)


def test_pi5_pmic_output(tmp_path: Path) -> None:
    root = board("rpi5", tmp_path)
    rails = parse_pmic((root / "vc/pmic_read_adc").read_text())
    assert "EXT5V" not in rails  # a voltage without a current is not a power reading
    assert rails["VDD_CORE"] == pytest.approx(0.82 * 0.88)
    command = f"{root}/vc/vcgencmd pmic_read_adc"
    total = power_sensor(root, power("vcgencmd_pmic", ""), pmic_command=command, timeout_s=5)
    assert total.read() == pytest.approx(sum(rails.values()))


@pytest.mark.parametrize(
    ("text", "now", "occurred"),
    [
        ("throttled=0x0", [], []),
        (
            "throttled=0x50005",
            ["under_voltage", "throttled"],
            ["under_voltage", "throttled"],
        ),
        ("throttled=0x80008", ["soft_temperature_limit"], ["soft_temperature_limit"]),
        ("throttled=0x20000", [], ["arm_frequency_capped"]),
    ],
)
def test_pi_throttled_bits(text: str, now: list[str], occurred: list[str]) -> None:
    flags = parse_throttled(text)
    assert flags.as_dict()["now"] == now
    assert flags.as_dict()["occurred"] == occurred


def test_pi_throttled_through_the_command(tmp_path: Path) -> None:
    root = board("rpi5", tmp_path)
    write(root, "vc/throttled", "throttled=0x50005")
    flags = PiThrottle(f"{root}/vc/vcgencmd get_throttled", 5).read()
    assert flags.under_voltage and flags.throttled and not flags.soft_temperature_limit
    with pytest.raises(SensorOffline, match="command not found"):
        PiThrottle(f"{root}/vc/missing get_throttled", 5).read()
    with pytest.raises(SensorOffline, match="Command not registered"):
        PiThrottle(f"{root}/vc/vcgencmd get_nothing", 5).read()
    write(root, "vc/throttled", 'error=2 error_msg="Invalid arguments"')
    with pytest.raises(SensorOffline, match="unexpected get_throttled output"):
        PiThrottle(f"{root}/vc/vcgencmd get_throttled", 5).read()


def test_battery_and_ac(tmp_path: Path) -> None:
    root = board("intel_laptop", tmp_path)
    monitor = SupplyMonitor(root, battery(), low_percent=20)
    state = monitor.read()
    assert (state.on_ac, state.percent, state.status, state.low) == (
        False,
        64.0,
        "Discharging",
        False,
    )
    write(root, "sys/class/power_supply/BAT0/capacity", 15)
    assert monitor.read().low
    write(root, "sys/class/power_supply/AC/online", 1)
    write(root, "sys/class/power_supply/BAT0/status", "Charging")
    assert not monitor.read().low and monitor.read().on_ac
    # no AC supply file: the battery status decides; unreadable capacity is unknown, not 0 %
    (root / "sys/class/power_supply/AC/online").unlink()
    write(root, "sys/class/power_supply/BAT0/status", "Discharging")
    (root / "sys/class/power_supply/BAT0/capacity").unlink()
    state = monitor.read()
    assert state.on_ac is False and state.percent is None and not state.low
    assert any("capacity" in e for e in state.errors)
    # hovering around the threshold does not flap: power-save ends 5 % above it (or on AC)
    monitor = SupplyMonitor(root, battery(), low_percent=20, hysteresis_percent=5)
    write(root, "sys/class/power_supply/BAT0/status", "Discharging")
    lows = []
    for percent in (21, 19, 21, 20, 24, 25, 19):
        write(root, "sys/class/power_supply/BAT0/capacity", percent)
        lows.append(monitor.read().low)
    assert lows == [False, True, True, True, True, False, True]
    # a desktop without either supply: one line saying so, nothing else
    state = SupplyMonitor(tmp_path, battery(), low_percent=20).read()
    assert state.errors == (f"no power supply 'BAT0' or 'AC' in {tmp_path}/sys/class/power_supply",)


def test_sensor_set_reads_everything_and_records_offline(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    sensors = SensorSet(
        root,
        GovernorSettings(),
        [zone("tj-thermal", 80, 90, 97), zone("gpu-thermal", 80, 90, 97)],
        [power("ina3221", "VDD_IN", total=True), power("ina3221", "VDD_SOC")],
    )
    readings = sensors.read()
    temps = {z.key: z.celsius for z in readings.zones}
    assert temps == {"zone:tj-thermal": 50.25, "zone:gpu-thermal": None}
    assert "zone:gpu-thermal" in readings.errors
    assert readings.total_power_w == pytest.approx(5.072 * 1.336)
    assert readings.trip_points["zone:tj-thermal"][0] == {"type": "passive", "celsius": 99.0}


def test_sum_of_rails_is_unknown_when_a_rail_is_offline(tmp_path: Path) -> None:
    root = board("jetson_orin", tmp_path)
    rails = [power("ina3221", "VDD_CPU_GPU_CV"), power("ina3221", "VDD_SOC")]
    sensors = SensorSet(root, GovernorSettings(), [], rails)
    assert sensors.read().total_power_w == pytest.approx(5.064 * (0.320 + 0.496))
    (root / "sys/bus/i2c/devices/1-0040/hwmon/hwmon3/curr3_input").unlink()
    readings = sensors.read()
    assert readings.total_power_w is None  # never a partial sum posing as the board's power
    assert readings.power_w["ina3221:VDD_SOC"] is None
