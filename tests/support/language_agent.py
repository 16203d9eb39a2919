"""The agent serving the tests' language model: ``edgeagent run`` in a process, on a Unix socket
and a loopback TCP port with a token, as an operator starts it (``devtools.agent_process``).

The package is the fetched SmolLM2 GGUF's (``tests/support/language.py``); the ``[llm]``
limits are small (a 512-token context, 2 threads) so every test takes seconds on two shared
cores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from devtools.agent_process import RunningDaemon, running_daemon
from devtools.waiting import wait_until
from tests.support.language import write_text_package

MODEL = "smollm2"
LIMITS = {"context": 512, "sequences": 4, "threads": 2, "max_tokens": 64, "default_max_tokens": 16}


class LanguageAgent(RunningDaemon):
    """The running daemon, and what the tests read of its language plane."""

    def status(self) -> dict[str, Any]:
        response = requests.get(f"{self.url}/v1/status", headers=self.headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def model_status(self) -> dict[str, Any]:
        return self.status()["language"]["models"][MODEL]

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (0 when the series does not exist yet)."""
        text = requests.get(f"{self.url}/metrics", headers=self.headers, timeout=30).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return sample.value
        return 0.0


@contextmanager
def language_agent(
    root: Path,
    server: str = "",
    package: Callable[[Path], object] = lambda where: write_text_package(where, MODEL),
    **limits: Any,
) -> Iterator[LanguageAgent]:
    """The daemon (``running_daemon``: its tiny package, a socket, loopback TCP with the token)
    also serving SmolLM2 with ``[llm]`` = ``LIMITS`` | ``limits``; ``server``: more lines for
    its ``[server]`` table; ``package`` writes the model's package into the folder it is
    given (the GGUF's by default). Ready once the model is."""
    package(root / "models" / MODEL)
    llm = "\n".join(f"{key} = {value}" for key, value in (LIMITS | limits).items())
    with running_daemon(root, f"{server}\n[llm]\n{llm}\n") as daemon:
        agent = LanguageAgent(daemon.process, daemon.socket, daemon.url, daemon.log)
        wait_until(lambda: _ready(agent), timeout=120)
        yield agent


def _ready(agent: LanguageAgent) -> bool:
    if not agent.alive():
        raise AssertionError(
            f"the agent exited {agent.process.returncode}: {agent.log.read_text()}"
        )
    try:
        return agent.model_status().get("state") == "READY"
    except (requests.RequestException, KeyError):
        return False


def whole_and_streamed(client: Any, **request: Any) -> tuple[Any, list[Any]]:
    """The stock ``openai`` client's chat completion for ``request``, whole and then streamed
    with usage (the last chunk carries it)."""
    whole = client.chat.completions.create(model=MODEL, **request)
    stream = client.chat.completions.create(
        model=MODEL, stream=True, stream_options={"include_usage": True}, **request
    )
    return whole, list(stream)
