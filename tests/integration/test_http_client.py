"""edgeagent.api.client and ``edgeagent status`` against a real agent over its socket and TCP."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from PIL import Image

from edgeagent.api.client import AgentClient, AgentError, AgentUnreachable
from edgeagent.cli import main
from tests.support.helpers import REPO
from tests.support.http_agent import AgentServer, direct_run, tiny_agent


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(tmp_path_factory.mktemp("client")) as server:
        yield server


@pytest.fixture(scope="module")
def client(agent: AgentServer) -> AgentClient:
    return AgentClient(socket_path=agent.socket, timeout=10)


def test_status_models_and_classify(client: AgentClient) -> None:
    assert client.status()["models"]["tiny"]["active_version"] == "1"
    assert client.models()[0]["state"] == "READY"
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (10, 200, 10)).save(buffer, format="PNG")
    answer = client.classify("tiny", buffer.getvalue(), top_k=2)
    assert len(answer["labels"]) == 2 and answer["backend"] == "onnxruntime"


@pytest.mark.parametrize("binary", [True, False])
def test_infer_matches_a_direct_run(agent: AgentServer, client: AgentClient, binary: bool) -> None:
    batch = np.random.default_rng(2).random((2, 3, 8, 8), dtype=np.float32)
    answer = client.infer("tiny", {"input": batch}, version="1", binary=binary)
    with direct_run(agent.packages[0]) as run:
        np.testing.assert_allclose(answer.outputs["logits"], run(batch), rtol=1e-5)
    assert answer.model_version == "1"


def test_errors_carry_status_and_message(client: AgentClient, tmp_path) -> None:
    with pytest.raises(AgentError) as caught:
        client.infer("ghost", {"input": np.zeros((1, 3, 8, 8), np.float32)})
    assert caught.value.status == 404 and "unknown model 'ghost'" in caught.value.message
    with pytest.raises(AgentError, match="400") as caught:
        client.classify("tiny", b"not an image")
    with pytest.raises(AgentUnreachable, match="cannot reach the agent"):
        AgentClient(socket_path=tmp_path / "none.sock").status()


def test_client_over_tcp_with_a_token(tmp_path) -> None:
    with tiny_agent(tmp_path, tcp_host="0.0.0.0", token="t0k") as server:
        with pytest.raises(AgentError) as caught:
            AgentClient(url=server.url).status()
        assert caught.value.status == 401
        assert "models" in AgentClient(url=server.url, token="t0k").status()


def test_status_command_json_and_text(agent: AgentServer, capsys, tmp_path) -> None:
    assert main(["status", "--socket", str(agent.socket), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["models"]["tiny"]["state"] == "READY"
    assert main(["status", "--url", agent.url]) == 1  # TCP needs the token
    assert "401" in capsys.readouterr().err
    config = tmp_path / "agent.toml"  # the CLI takes it from the config, as the agent does
    config.write_text(f'[server]\ntoken = "{agent.settings.token}"\n')
    assert main(["status", "--url", agent.url, "--config", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f" at {agent.url} " in lines[0]
    assert any(line.split()[:2] in (["models", "tiny"], ["tiny", "1"]) for line in lines)
    assert len(lines) < 12  # a summary, not the document


def test_status_command_reports_an_absent_agent(tmp_path, capsys) -> None:
    assert main(["status", "--socket", str(tmp_path / "absent.sock")]) == 2
    assert "cannot reach the agent at" in capsys.readouterr().err
    assert main(["status", "--url", "ftp://x"]) == 2


def test_status_command_as_a_process(agent: AgentServer) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "status", "--socket", str(agent.socket), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["models"]["tiny"]["active_version"] == "1"


def test_status_command_finds_the_socket_in_the_config(
    agent: AgentServer, tmp_path, capsys
) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'[server]\nunix_socket = "{agent.socket}"\n')
    assert main(["status", "--config", str(config), "--json"]) == 0
    assert "models" in json.loads(capsys.readouterr().out)
    config.write_text("[server]\nunix_sockets = 1\n")
    assert main(["status", "--config", str(config)]) == 2
    assert "unix_sockets" in capsys.readouterr().err
