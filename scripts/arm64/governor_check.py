"""The governor inside the real daemon, on the Raspberry Pi 5 sysfs fixture: read, then react.

A copy of tests/fixtures/thermal/rpi5 (cpu-thermal at 61.85 °C, the vcgencmd stand-in that
answers get_throttled and pmic_read_adc from files) is the daemon's [hardware] root, with the
raspberry-pi-5 profile. Over the Unix socket, /v1/status must show the zone read against the
profile's limits, the PMIC's power and state normal; then the firmware reports under-voltage
and throttling (throttled=0x50005) and the state must become hot with power-save on. Every wait
is bounded ([governor] interval_s is short so the check is quick even emulated).
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # devtools; edgeagent from the installed wheel

from devtools.tiny import write_tiny_package  # noqa: E402
from devtools.waiting import until  # noqa: E402
from edgeagent.config import parse_config  # noqa: E402
from edgeagent.daemon import Daemon  # noqa: E402

TIMEOUT_S = 300.0
FIXTURE = REPO / "tests/fixtures/thermal/rpi5"


async def check(tmp: Path) -> str:
    root = tmp / "rpi5"
    shutil.copytree(FIXTURE, root, symlinks=True)
    write_tiny_package(tmp / "models" / "tiny")
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp / 'state'}'\nmodels_dir = '{tmp / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp / 'agent.sock'}'\ntcp_port = 0\n"
        f"[hardware]\nroot = '{root}'\nprofile = 'raspberry-pi-5'\n"
        "[governor]\ninterval_s = 0.1\nmin_dwell_s = 0.3\n"
        f"throttle_command = '{root}/vc/vcgencmd get_throttled'\n"
        f"pmic_command = '{root}/vc/vcgencmd pmic_read_adc'\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    try:
        connector = aiohttp.UnixConnector(path=str(tmp / "agent.sock"))
        async with aiohttp.ClientSession(connector=connector, base_url="http://agent") as http:

            async def governor() -> dict:
                async with http.get("/v1/status") as response:
                    return (await response.json())["governor"]

            async def has_power() -> bool:
                return bool(((await governor()).get("power") or {}).get("total_w"))

            await until(has_power, TIMEOUT_S, what="a power reading")
            first = await governor()
            zones = {t["sensor"]: t for t in first["temperatures"]}
            zone = zones["zone:cpu-thermal"]
            assert zone["online"] and abs(zone["celsius"] - 61.85) < 0.01, zone
            assert (zone["warm_c"], zone["hot_c"]) == (70.0, 80.0), zone
            assert first["state"] == "normal" and not first["power_save"], first
            print(f"normal: cpu-thermal {zone['celsius']} °C, {first['power']['total_w']:.2f} W")

            (root / "vc/throttled").write_text("throttled=0x50005\n")

            async def hot() -> bool:
                now = await governor()
                return now["state"] == "hot" and now["power_save"]

            await until(hot, TIMEOUT_S, what="state hot with power-save")
            after = await governor()
            print(f"after throttled=0x50005: {after['state']}, power_save, {after['reason']}")
            return (
                f"cpu-thermal {zone['celsius']} °C normal, PMIC {first['power']['total_w']:.2f} W; "
                f"throttled=0x50005 → hot + power-save ({after['firmware_throttle']['now']})"
            )
    finally:
        await daemon.stop()


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="arm64-governor-") as tmp:
        summary = asyncio.run(check(Path(tmp)))
    print(f"summary: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
