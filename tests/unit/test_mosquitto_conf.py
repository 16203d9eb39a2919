"""The shipped Mosquitto configuration holds a stage's answers for the hub.

Mosquitto drops QoS 1 messages beyond ``max_queued_messages`` per client without a word; with
its default (1000) a stage of a few hundred devices loses answers and the deployment times out
devices that succeeded. The fleet benchmark runs its hub broker with 100,000, and so must the
configuration operators copy.
"""

from __future__ import annotations

from tests.support.helpers import REPO

CONF = REPO / "deploy" / "mosquitto" / "mosquitto.conf"
MOSQUITTO_DEFAULT = 1000
BENCHMARK_QUEUE = 100_000  # devtools/fleet_scenario.py's hub broker


def global_options() -> dict[str, str]:
    """The options before the first ``listener`` (Mosquitto's global section)."""
    options: dict[str, str] = {}
    for line in CONF.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("#")[0].strip().partition(" ")
        if key == "listener":
            break
        if key:
            options[key] = value.strip()
    return options


def test_the_queue_holds_a_stage_of_the_benchmarked_fleet() -> None:
    options = global_options()
    queued = int(options["max_queued_messages"])
    assert queued >= BENCHMARK_QUEUE > MOSQUITTO_DEFAULT
    assert int(options["max_queued_bytes"]) > 0  # the memory stays bounded whatever the count
