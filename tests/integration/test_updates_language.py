"""A language model's signed release through the whole product: ``edgeagent package`` ▸ ``hub
sign`` (the GGUF in its own variant artifact, golden.json in the shared one) ▸ ``hub publish``
over a real Mosquitto ▸ the daemon downloads, checks the golden chats, hot-swaps ▸ the stock
``openai`` and ``ollama`` clients see the new version. Then a release whose recorded greedy
tokens were changed before signing fails its health check, is rolled back and reported as
``health_check_failed``, and the version before it still answers."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import ollama
import openai
import pytest

from devtools.agent_process import TOKEN
from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.cli import main
from edgeagent.fleet import outcomes
from tests.integration.test_updates_e2e import cli
from tests.integration.test_updates_helpers import Hub, hub_fixture  # noqa: F401 - fixture
from tests.support.language import SMOLLM2, smollm2_gguf
from tests.support.language_agent import MODEL, LanguageAgent, language_agent

pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")
pytestmark = pytest.mark.broker

DEVICE_ID = "dev-llm"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def updates_config(hub: Hub, broker: Broker) -> str:
    """The daemon's tables past [server]: updates from this hub over this broker. No decode
    floor: the two shared cores of CI decode at whatever rate they have left."""
    tables = hub.device_tables(broker.port, llm_tokens_per_second_floor=0, health_timeout_s=120)
    return f'\n[agent]\ndevice_id = "{DEVICE_ID}"\n\n{tables}'


def package(out: Path, version: str) -> Path:
    """SmolLM2 packaged by ``edgeagent package`` (its golden chats recorded on 2 threads)."""
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        status = main(
            [
                *("package", str(smollm2_gguf()), "--out", str(out)),
                *("--version", version, "--name", MODEL, "--threads", "2"),
            ]
        )
    assert status == 0
    return out


def tampered(packaged: Path, out: Path, version: str) -> Path:
    """A copy of ``packaged`` at ``version`` whose first recorded greedy token was changed."""
    shutil.copytree(packaged, out)
    toml = out / "model.toml"
    old = json.dumps(packaged.name.rsplit("-", 1)[1])
    toml.write_text(
        toml.read_text().replace(f"version = {old}", f"version = {json.dumps(version)}")
    )
    record = json.loads((out / "golden.json").read_text())
    tokens = record["prompts"][0]["tokens"]["llama_cpp/q4_1"]
    tokens[0] = (tokens[0] + 1) % 49152
    (out / "golden.json").write_text(json.dumps(record))
    return out


async def sign_and_publish(hub: Hub, broker: Broker, packaged: Path, *extra: str) -> dict[str, Any]:
    signed = await asyncio.to_thread(cli, *hub.sign_command(packaged, *extra))
    assert signed.returncode == 0, signed.stderr
    answer = json.loads(signed.stdout)
    published = await asyncio.to_thread(cli, *hub.publish_command(answer["release"], broker.port))
    assert published.returncode == 0, published.stderr
    return answer


async def outcome(agent: LanguageAgent, version: str) -> dict[str, Any]:
    """The update outcome of ``version``, once the daemon reports one."""
    found: dict[str, Any] = {}

    def reported() -> bool:
        last = agent.status()["updates"]["last"] or {}
        found.update(last)
        return last.get("version") == version and not agent.status()["updates"]["queued"]

    try:
        await until(lambda: asyncio.to_thread(reported), timeout=240)
    except AssertionError:
        raise AssertionError(
            f"no outcome for {version}: {found}\n{agent.log.read_text()}"
        ) from None
    return found


def answer(agent: LanguageAgent) -> str:
    client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)
    whole = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=8, temperature=0
    )
    text = whole.choices[0].message.content
    assert text and [m.id for m in client.models.list()] == [MODEL]
    return text


def served_version(agent: LanguageAgent) -> str:
    client = ollama.Client(host=agent.url, headers={"Authorization": f"Bearer {TOKEN}"})
    modelfile = client.show(MODEL).modelfile or ""
    assert agent.model_status()["version"] in modelfile
    return agent.model_status()["version"]


async def test_a_signed_language_model_release_serves_and_a_tampered_one_rolls_back(
    tmp_path: Path, hub: Hub, broker: Broker
) -> None:
    good = await asyncio.to_thread(
        package, tmp_path / "hub" / "packages" / "smollm2-1.1.0", "1.1.0"
    )
    bad = tampered(good, tmp_path / "hub" / "packages" / "smollm2-1.2.0", "1.2.0")
    running = language_agent(tmp_path / "device", server=updates_config(hub, broker))
    agent = await asyncio.to_thread(running.__enter__)
    try:
        assert await asyncio.to_thread(served_version, agent) == "1.0.0"  # the seed package

        signed = await sign_and_publish(hub, broker, good, "--canary")  # asked, not taken
        with tarfile.open(signed["artifact"]) as shared:  # what every device downloads
            assert sorted(shared.getnames()) == ["golden.json", "model.toml"]
        with tarfile.open(hub.artifacts / f"{MODEL}-1.1.0.llama_cpp.q4_1.tar.gz") as variant:
            assert variant.getnames() == [SMOLLM2]  # the GGUF: only devices running it fetch it
        result = await outcome(agent, "1.1.0")
        assert (result["result"], result["code"]) == ("succeeded", outcomes.COMMITTED), result
        assert "smollm2 1.1.0: a language model takes no live canary" in agent.log.read_text()
        assert await asyncio.to_thread(served_version, agent) == "1.1.0"
        before = await asyncio.to_thread(answer, agent)

        await sign_and_publish(hub, broker, bad)
        result = await outcome(agent, "1.2.0")
        assert (result["result"], result["code"]) == ("failed", outcomes.HEALTH_CHECK_FAILED)
        assert "rolled back" in result["message"] and "golden prompt 0" in result["message"]
        assert await asyncio.to_thread(served_version, agent) == "1.1.0"
        assert await asyncio.to_thread(answer, agent) == before  # greedy: the same answer

        fleet = await asyncio.to_thread(
            cli, "status", "--broker", f"127.0.0.1:{broker.port}", "--json", "--wait", "1"
        )
        rows = json.loads(fleet.stdout)
        assert rows[0]["device_id"] == DEVICE_ID and rows[0]["models"][MODEL] == "1.1.0"
        assert (rows[0]["last_result"], rows[0]["last_code"]) == ("failed", "health_check_failed")
        updates = agent.status()["updates"]
        assert updates["installed"][MODEL] == "1.1.0" and updates["pending"] is None
    finally:
        await asyncio.to_thread(running.__exit__, None, None, None)
