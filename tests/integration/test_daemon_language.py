"""The daemon serves a language package from its models directory beside a tensor one: each
goes to its own plane, a reload swaps a new version in and unloads a removed one."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import pytest

pytest.importorskip("llama_cpp")
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from tests.support.helpers import write_tiny_package
from tests.support.language import write_text_package


@pytest.fixture
async def daemon(tmp_path: Path):
    write_tiny_package(tmp_path / "models" / "tiny", seed=1)
    write_text_package(tmp_path / "models" / "smollm2")
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        "[llm]\ncontext = 512\nsequences = 2\nthreads = 2\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    yield daemon
    await daemon.stop()


async def _get(daemon: Daemon, path: str) -> dict:
    connector = aiohttp.UnixConnector(path=str(daemon.config.server.unix_socket))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(f"http://agent{path}") as response,
    ):
        assert response.status == 200, await response.text()
        return await response.json()


async def test_each_package_goes_to_its_plane_and_a_reload_swaps_and_unloads(
    daemon: Daemon, tmp_path: Path
) -> None:
    status = await _get(daemon, "/v1/status")
    assert set(status["models"]) == {"tiny"}  # the tensor registry never saw the text package
    language = status["language"]["models"]["smollm2"]
    assert language["state"] == "READY" and language["context"] == 512
    assert language["runtime"] == "llama_cpp" and language["sequences"] == 2
    assert [m["id"] for m in (await _get(daemon, "/v1/models"))["data"]] == ["smollm2"]

    write_text_package(tmp_path / "models" / "smollm2", version="1.1.0")
    await daemon.reload()
    assert [m.version for m in daemon.language.models()] == ["1.1.0"]
    shutil.rmtree(tmp_path / "models" / "smollm2")
    await daemon.reload()
    assert daemon.language.models() == []
    assert set((await _get(daemon, "/v1/status"))["models"]) == {"tiny"}
