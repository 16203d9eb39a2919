"""SIGHUP (the unit's ExecReload) re-reads the config and the models directory of a live agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.agent_process import Agent
from edgeagent.api.client import AgentError
from tests.support.helpers import write_tiny_package

BATCH = np.zeros((1, 3, 8, 8), dtype=np.float32)


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    write_tiny_package(tmp_path / "models" / "tiny")
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{tmp_path / "models"}"\n')
    running = Agent(tmp_path, config)
    yield running
    assert running.stop() == 0


def test_a_package_added_then_sighup_is_served(agent: Agent, tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="unknown model 'second'"):
        agent.client.infer("second", {"input": BATCH})
    write_tiny_package(tmp_path / "models" / "second", name="second", classes=6)
    line = agent.hup_and_wait_for("reloaded: serving")
    assert "second 1" in line and "tiny 1" in line
    assert agent.client.infer("second", {"input": BATCH}).outputs["logits"].shape == (1, 6)


def test_a_removed_package_unloads_and_a_new_version_swaps_in(agent: Agent, tmp_path: Path) -> None:
    write_tiny_package(tmp_path / "models" / "tiny", version="2", classes=3)
    agent.hup_and_wait_for("reloaded: serving tiny 2")
    answer = agent.client.infer("tiny", {"input": BATCH})
    assert (answer.model_version, answer.outputs["logits"].shape) == ("2", (1, 3))
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{tmp_path / "empty"}"\n')
    # A models directory that is named but missing is a mistake, not an empty fleet: refused.
    refused = agent.hup_and_wait_for("reload refused, still running the previous config")
    assert "does not exist" in refused
    assert agent.client.infer("tiny", {"input": BATCH}).model_version == "2"
    (tmp_path / "empty").mkdir()
    agent.hup_and_wait_for("reloaded: serving no models")
    with pytest.raises(AgentError, match="tiny"):
        agent.client.infer("tiny", {"input": BATCH})


def test_a_broken_config_is_refused_and_the_agent_keeps_serving(
    agent: Agent, tmp_path: Path
) -> None:
    (tmp_path / "agent.toml").write_text("[agent]\nlog_level = 7\n")
    line = agent.hup_and_wait_for("reload refused")
    assert "[agent] log_level: must be a string" in line
    assert agent.client.infer("tiny", {"input": BATCH}).outputs["logits"].shape == (1, 4)
