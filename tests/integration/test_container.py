"""The container image: its definition always, a real build and run where an engine works."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.helpers import REPO, write_tiny_package

DOCKERFILE = (REPO / "Dockerfile").read_text()


def _engine() -> str | None:
    """docker or podman, when its daemon answers (a client alone cannot build)."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
            return path
    return None


def test_the_image_is_multi_stage_non_root_with_volumes_health_and_ports() -> None:
    lines = [line.strip() for line in DOCKERFILE.splitlines()]
    assert sum(line.startswith("FROM ") for line in lines) == 2
    assert "FROM ${PYTHON_IMAGE} AS build" in lines
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in lines
    assert "USER edgeagent" in lines
    assert 'VOLUME ["/models", "/var/lib/edgeagent", "/run/edgeagent"]' in lines
    assert "EXPOSE 8080" in lines
    health = DOCKERFILE.split("HEALTHCHECK", 1)[1].split("\n\n", 1)[0]
    assert "/v2/health/ready" in health
    # the image installs with the board's own script, in container mode
    assert "RUN install-device.sh --container --source /dist/edgeagent-*.whl" in DOCKERFILE


def test_container_mode_of_the_script_installs_no_unit(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "scripts/install-device.sh"), "--container", "--dry-run",
         "--root", str(tmp_path / "r"), "--source", "x.whl", "--extras", "litert"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "x.whl[litert]" in result.stdout
    assert "edgeagent.service" not in result.stdout and "sysusers" not in result.stdout


@pytest.mark.slow
def test_the_image_builds_and_serves_a_package(tmp_path: Path) -> None:
    engine = _engine()
    if engine is None:
        pytest.skip("no working docker or podman here")
    tag = f"edgeagent-test:{uuid.uuid4().hex[:8]}"
    subprocess.run(
        [engine, "build", "--build-arg", "EXTRAS=", "-t", tag, str(REPO)], check=True, timeout=900
    )
    write_tiny_package(tmp_path / "models" / "tiny")
    (tmp_path / "models").chmod(0o755)
    name = tag.replace(":", "-")
    try:
        subprocess.run(
            [engine, "run", "-d", "--name", name, "-v", f"{tmp_path / 'models'}:/models:ro", tag],
            check=True, timeout=120,
        )  # fmt: skip
        logs = subprocess.Popen([engine, "logs", "-f", name], stdout=subprocess.PIPE, text=True)
        assert logs.stdout is not None
        first = logs.stdout.readline()  # printed once every model is READY
        logs.kill()
        assert first.startswith("edgeagent serving tiny 1"), first
        ready = subprocess.run(
            [engine, "exec", name, "python", "-c",
             "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/v2/health/ready').status)"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert ready.stdout.strip() == "200", ready.stderr
        user = subprocess.run(
            [engine, "exec", name, "id", "-un"], capture_output=True, text=True, timeout=60
        )
        assert user.stdout.strip() == "edgeagent"
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, timeout=120)
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120)
