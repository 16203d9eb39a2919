"""The daemon with [grpc] enabled: one data plane and one set of shm regions under both APIs."""

from __future__ import annotations

from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as triton

from edgeagent.api.shm.regions import agent_user
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.sections import ConfigError
from tests.support.helpers import write_tiny_package


async def test_daemon_serves_grpc_on_its_unix_socket_and_removes_it(tmp_path: Path) -> None:
    write_tiny_package(tmp_path / "models" / "tiny", seed=1)
    grpc_socket = tmp_path / "grpc.sock"
    config = parse_config(
        f"[agent]\nstate_dir = '{tmp_path / 'state'}'\nmodels_dir = '{tmp_path / 'models'}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        f"[grpc]\nenabled = true\nport = 0\nunix_socket = '{grpc_socket}'\n"
        "socket_mode = 0o600\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    try:
        assert daemon.listening == [str(tmp_path / "agent.sock"), f"unix:{grpc_socket}"]
        assert grpc_socket.stat().st_mode & 0o777 == 0o600
        client = triton.InferenceServerClient(f"unix:{grpc_socket}")
        x = np.zeros((1, 3, 8, 8), np.float32)
        tensor = triton.InferInput("input", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        result = await client.infer("tiny", [tensor])
        assert result.as_numpy("logits").shape == (1, 4)
        region = shared_memory.SharedMemory(create=True, size=64)
        await client.register_system_shared_memory("frame", "/" + region.name, 64)
        # The 0600 socket admits only the agent's user: its regions are that user's, as over HTTP
        held = daemon.shared_memory.get(agent_user(), "frame")
        await client.close()
    finally:
        await daemon.stop()
    assert not grpc_socket.exists()
    assert held.closed, "the daemon closes every region when it stops"
    region.close()
    region.unlink()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (
            "[server]\ntcp_auth = 'none'\n[grpc]\nenabled = true\nhost = '0.0.0.0'\n",
            "[grpc] host: [server] tcp_auth = 'none' is only allowed on loopback",
        ),
        ("[grpc]\nport = 70000\n", "[grpc] port: must be 0..65535"),
        ("[grpc]\nmax_message_bytes = 0\n", "[grpc] max_message_bytes: must be positive"),
        ("[grpc]\nhots = 'x'\n", "[grpc] unknown key(s) hots"),
        ("[shared_memory]\nmax_region_bytes = 0\n", "[shared_memory] max_region_bytes"),
    ],
)
def test_bad_grpc_and_shm_config_is_refused_by_key(text: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert words in str(caught.value)


def test_grpc_beyond_loopback_with_the_token_rule_is_accepted() -> None:
    config = parse_config(
        "[server]\ntoken = 't'\n[grpc]\nenabled = true\nhost = '0.0.0.0'\ntls = 'off'\n"
    )
    assert config.grpc.host == "0.0.0.0" and config.server.tcp_auth == "token"
