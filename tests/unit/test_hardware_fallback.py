"""Fallback at run time on real runtimes: demotion, retry on the successor, re-probe, power mode."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from devtools.waiting import wait_until
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.package import load_package
from edgeagent.runtimes import InferenceError, RuntimeLoadError
from tests.support.hardware import (
    FIXTURES,
    install_flaky,
    write_multi_package,
    write_profile,
)

ORT = "onnxruntime:CPUExecutionProvider:fp32"
OV = "openvino:CPU:fp32"
BATCH = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)


def _accelerators(tmp_path: Path, candidates: list[str], **settings) -> Accelerators:
    write_profile(tmp_path / "profiles", "test", candidates)
    hw = HardwareSettings(
        root=FIXTURES / "generic-x86_64",
        profiles_dir=tmp_path / "profiles",
        profile="test",
        **{"reprobe_backoff_s": 60.0, "failure_threshold": 3, **settings},
    )
    return Accelerators(hw, tmp_path / "state")


@pytest.fixture
def flaky_onnx(monkeypatch: pytest.MonkeyPatch):
    return install_flaky(monkeypatch)


@pytest.fixture
def package(tmp_path: Path):
    return load_package(
        write_multi_package(tmp_path / "pkg", [("onnxruntime", "fp32"), ("openvino", "fp32")])
    )


def test_broken_device_is_demoted_and_requests_keep_succeeding(tmp_path, package, flaky_onnx):
    flaky_onnx.good_calls = 3  # the probe run + two requests, then the "device" is gone
    acc = _accelerators(tmp_path, [f"{ORT}", f"{OV}"])
    session = acc.open(package)
    assert session.candidate.key == ORT
    expected = session.run({"input": BATCH})["logits"]
    results = [session.run({"input": BATCH})["logits"] for _ in range(20)]  # none may fail
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    assert session.candidate.key == OV
    status = session.status()
    assert status["active"]["candidate"] == OV
    (demotion,) = status["demotions"]
    assert demotion["candidate"] == ORT
    assert "probe input fails too" in demotion["reason"]
    assert "onnxruntime" in demotion["reason"]  # the runtime's own error text
    ort_entry = next(c for c in status["candidates"] if c["candidate"] == ORT)
    assert ort_entry["state"] == "demoted" and ort_entry["reprobe_in_s"] > 0
    assert acc.report()["models"]["tiny:1"]["active"]["candidate"] == OV
    session.close()
    assert acc.report()["models"] == {}  # a closed version leaves the report


def test_consecutive_errors_demote_even_when_the_probe_input_passes(tmp_path, package, flaky_onnx):
    flaky_onnx.max_batch = 1  # batch-1 works (and so does the health check); batches fail
    acc = _accelerators(tmp_path, [ORT, OV], failure_threshold=3)
    session = acc.open(package)
    for _ in range(2):  # below the threshold: the request fails, the candidate stays
        with pytest.raises(InferenceError, match="onnxruntime"):
            session.run({"input": BATCH})
        assert session.candidate.key == ORT
    out = session.run({"input": BATCH})  # the third error demotes; the retry succeeds on OpenVINO
    assert out["logits"].shape == (2, 4)
    assert session.candidate.key == OV
    assert "3 consecutive run errors" in session.status()["demotions"][0]["reason"]
    session.close()


def test_demoted_candidate_is_reprobed_and_takes_over_again(tmp_path, package, flaky_onnx):
    flaky_onnx.good_calls = 2  # the probe run and one request
    flaky_onnx.bad_calls = 2  # the next request and its health probe fail, then it is back
    acc = _accelerators(tmp_path, [ORT, OV], reprobe_backoff_s=0.2)
    session = acc.open(package)
    session.run({"input": BATCH})
    session.run({"input": BATCH})  # breaks ORT: OpenVINO takes over
    assert session.status()["demotions"][0]["candidate"] == ORT
    wait_until(lambda: session.candidate.key == ORT)
    assert session.run({"input": BATCH})["logits"].shape == (2, 4)
    assert flaky_onnx.loads == 2
    session.close()


def test_failing_reprobe_backs_off_exponentially(tmp_path, package, flaky_onnx):
    flaky_onnx.good_calls = 1
    acc = _accelerators(tmp_path, [ORT, OV], reprobe_backoff_s=0.1, reprobe_backoff_max_s=0.4)
    session = acc.open(package)
    session.run({"input": BATCH})  # ORT fails, demoted with a 0.1 s back-off
    wait_until(lambda: len(session.status()["demotions"]) >= 4)
    backoffs = [d["reprobe_after_s"] for d in session.status()["demotions"]]
    assert backoffs[:4] == [0.1, 0.2, 0.4, 0.4]
    assert "load failed" in session.status()["demotions"][1]["reason"]
    assert session.candidate.key == OV
    session.close()


def test_load_failure_falls_back_and_all_failing_raises(tmp_path, package) -> None:
    (package.root / "tiny.fp32.onnx").write_bytes(b"corrupted underneath")
    acc = _accelerators(tmp_path, [ORT, OV])
    session = acc.open(package)
    assert session.candidate.key == OV
    ort_entry = next(c for c in session.status()["candidates"] if c["candidate"] == ORT)
    assert ort_entry["state"] == "unavailable"
    assert "could not load tiny.fp32.onnx" in ort_entry["reason"]
    session.close()
    (package.root / "tiny.openvino.fp32.onnx").write_bytes(b"corrupted too")
    with pytest.raises(
        RuntimeLoadError, match=rf"no candidate of profile test runs tiny: {ORT}: .*could not load"
    ):
        _accelerators(tmp_path / "again", [ORT, OV]).open(package)


def test_power_mode_switches_to_the_low_power_candidate_and_back(tmp_path, package) -> None:
    acc = _accelerators(tmp_path, [ORT, f"{OV}:low"])
    session = acc.open(package)
    assert session.candidate.key == ORT
    session.set_power_mode("low")
    assert session.candidate.key == OV and session.status()["power_mode"] == "low"
    assert session.run({"input": BATCH})["logits"].shape == (2, 4)
    session.set_power_mode("high")
    assert session.candidate.key == ORT
    with pytest.raises(ValueError, match="power mode"):
        session.set_power_mode("turbo")
    session.close()


def test_power_mode_without_a_low_candidate_stays(tmp_path, package) -> None:
    session = _accelerators(tmp_path, [ORT, OV]).open(package)
    session.set_power_mode("low")
    assert session.candidate.key == ORT
    session.close()


def test_retired_session_closes_only_when_idle(tmp_path, package, flaky_onnx) -> None:
    """Switching while a run is in flight must not close the session under that run."""
    acc = _accelerators(tmp_path, [ORT, f"{OV}:low"])
    session = acc.open(package)
    lease = session._acquire()  # a run in flight on ORT
    session.set_power_mode("low")
    assert lease.retired
    assert lease.session.run({"input": BATCH})["logits"].shape == (2, 4)  # still usable
    session._release(lease)
    with pytest.raises(Exception):  # noqa: B017 - closed once idle: any use now fails
        lease.session.run({"input": BATCH})
    session.close()


def test_concurrent_requests_fail_fast_during_a_failover_and_succeed_after(
    tmp_path, package, flaky_onnx
):
    flaky_onnx.good_calls = 20
    session = _accelerators(tmp_path, [ORT, OV]).open(package)
    expected = session.run({"input": BATCH})["logits"]

    def attempt(_):
        try:
            return session.run({"input": BATCH})["logits"]
        except InferenceError as exc:  # only while the successor loads, and said so
            assert "switching accelerators" in str(exc)
            return None

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, range(80)))
    answered = [r for r in results if r is not None]
    assert answered  # those before the device broke; after the failover every request works
    for result in [*answered, session.run({"input": BATCH})["logits"]]:
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)
    assert session.candidate.key == OV
    assert len(session.status()["demotions"]) == 1
    session.close()
