"""The canary policy of a release (``fleet.release_canary``): a leaf with bounds that keep
every canary finite, and numbers parsed so that no signed table crashes the manifest parser
(issue 23 §12).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from edgeagent.fleet.manifest import ManifestError, parse_manifest
from edgeagent.fleet.release_canary import LIMITS, ReleaseCanary, check_threshold

BIG = 10**400  # a JSON integer Python reads exactly and float() cannot hold


def _short(value: object) -> str | None:
    """Test ids: 10**400 by name, not its 401 digits."""
    return "10**400" if isinstance(value, int) and value == BIG else None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("share", 0, "not within 0.001..0.5"),
        ("share", 1e-300, "not within 0.001..0.5"),
        ("share", 0.9, "not within 0.001..0.5"),
        ("share", BIG, "not within 0.001..0.5"),
        ("share", math.nan, "nan is not within"),
        ("max_seconds", math.inf, "inf is not within 1..604800"),
        ("max_seconds", BIG, "1000000000000000000000000000000000000... is not within"),
        ("max_seconds", -math.inf, "not within 1..604800"),
        ("max_p99_ratio", 0.5, "not within 1..100"),
        ("max_error_rate", 1.5, "not within 0..1"),
        ("min_requests", BIG, "not within 1..1000000"),
        ("min_requests", 2.5, "must be an integer"),
        ("min_requests", 2.0, "must be an integer"),
        ("min_requests", True, "must be an integer"),
        ("max_seconds", True, "must be a number"),
        ("share", "0.1", "must be a number"),
        ("share", None, "must be a number"),
        ("max_latency", 2, "max_latency' \\(known: share"),
    ],
    ids=_short,
)
def test_thresholds_are_bounded_with_errors_naming_the_key(
    key: str, value: object, message: str
) -> None:
    with pytest.raises(ValueError, match=f"^(canary {key}|unknown canary setting).*{message}"):
        check_threshold(key, value)


def test_every_bound_is_accepted_and_numbers_keep_their_kind() -> None:
    for key, (low, high) in LIMITS.items():
        kind = int if key == "min_requests" else float
        assert check_threshold(key, kind(low)) == low and check_threshold(key, kind(high)) == high
    assert isinstance(check_threshold("min_requests", 200), int)
    assert isinstance(check_threshold("max_seconds", 60), float)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("share=nan", "canary share: nan is not within"),
        ("max_seconds=1e400", "canary max_seconds: inf is not within"),
        ("min_requests=" + "9" * 5000, "min_requests: '9999"),
        ("min_requests=1e3", "min_requests: '1e3' is not a number"),
        ("share", "is not KEY=VALUE"),
        ("share=0.1,share=0.2", "share is given twice"),
    ],
)
def test_the_sign_option_refuses_hostile_numbers(option: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReleaseCanary.from_option(option)


def _manifest(canary: object) -> bytes:
    """A well-formed release payload with ``canary`` as its table (json writes 10**400 as is;
    the string ``"1e400"`` becomes that JSON number, which Python reads as infinity)."""
    document = {
        "type": "release",
        "format": 2,
        "serial": 2,
        "model": "tiny",
        "version": "2",
        "artifact": {"url": "https://hub.example/a.tar.gz", "size": 1, "sha256": "0" * 64},
        "variants": [
            {
                "runtime": "onnxruntime",
                "precision": "fp32",
                "url": "https://hub.example/v.tar.gz",
                "size": 1,
                "sha256": "0" * 64,
            }
        ],
        "targets": {},
        "issued_at": "2030-01-01T00:00:00Z",
        "expires": "2030-01-02T00:00:00Z",
        "deployment_id": "d-1",
        "min_agent_version": "0.1.0",
        "canary": canary,
    }
    return json.dumps(document).replace('"1e400"', "1e400").encode()


@pytest.mark.parametrize(
    ("canary", "message"),
    [
        ({"max_seconds": BIG}, "manifest canary: canary max_seconds: 1000"),
        ({"share": BIG}, "manifest canary: canary share: 1000"),
        ({"max_p99_ratio": "1e400"}, "manifest canary: canary max_p99_ratio: inf"),
        ({"share": True}, "manifest canary: canary share: must be a number"),
        ({"min_requests": 1e6}, "manifest canary: canary min_requests: must be an integer"),
        ([0.1], "manifest canary: must be an object"),
    ],
)
def test_the_manifest_parser_refuses_a_hostile_canary_table(canary: object, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(_manifest(canary))


def test_a_table_in_bounds_parses() -> None:
    table = {"share": 0.001, "min_requests": 1_000_000, "max_seconds": 604800}
    manifest = parse_manifest(_manifest(table))
    assert manifest.canary == ReleaseCanary(share=0.001, min_requests=1_000_000, max_seconds=604800)


def test_the_policy_is_a_leaf_the_hub_signs_with_no_engine() -> None:
    """``fleet.release_canary`` imports nothing of the agent; the hub's signing loads no engine
    and no prometheus_client (it used to, through ``engine.canary_judge`` → ``engine.serving``)."""
    probe = (
        "import sys, edgeagent.fleet.release_canary; "
        "leaf = sorted(m for m in sys.modules if m.startswith('edgeagent.')); "
        "import edgeagent.hub.sign; "
        "engine = sorted(m for m in sys.modules if m.startswith('edgeagent.engine')); "
        "print(leaf, engine, 'prometheus_client' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == [
        "['edgeagent.fleet',",
        "'edgeagent.fleet.release_canary']",
        "[]",
        "False",
    ]
