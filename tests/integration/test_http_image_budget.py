"""Images decode within one pixel budget across requests ([server] max_decoding_pixels).

A flat PNG of 40 Mpx is a 115 kB upload that takes ~300 MB while decoded and resized, so the
per-image limit alone let eight such uploads at once take over a gigabyte of a small board.
Each image now reserves its width × height (read from its header) before a pixel is decoded.
The decoding step is held open here (events, no sleeps) to see who gets in while it is busy.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from edgeagent.api.client import AgentClient, AgentError
from edgeagent.models import preprocess
from edgeagent.sections import ConfigError
from tests.support.http_agent import tiny_agent
from tests.support.toy_detector import image_bytes

LARGE, SMALL = (120, 100), (50, 40)  # 12,000 and 2,000 pixels


class _HeldDecoder:
    """Wraps the resize that follows decoding: large images wait there until ``release``."""

    def __init__(self, resize: Any) -> None:
        self.resize = resize
        self.large_inside = 0
        self.most_large_inside = 0
        self.large_entered = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, image: Any, spec: Any) -> Any:
        if image.size != LARGE:
            return self.resize(image, spec)
        with self.lock:
            self.large_inside += 1
            self.most_large_inside = max(self.most_large_inside, self.large_inside)
        self.large_entered.set()
        try:
            self.release.wait(20)  # bounded: a broken budget fails the test, never hangs it
            return self.resize(image, spec)
        finally:
            with self.lock:
                self.large_inside -= 1


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> _HeldDecoder:
    decoder = _HeldDecoder(preprocess.resize_and_crop)
    monkeypatch.setattr(preprocess, "resize_and_crop", decoder)
    return decoder


def test_a_second_large_image_waits_then_gets_503_while_a_small_one_fits(
    tmp_path: Path, held: _HeldDecoder
) -> None:
    budget = 15_000  # one large image (12,000) and one small (2,000), never two large
    with tiny_agent(
        tmp_path, max_image_pixels=budget, max_decoding_pixels=budget, request_timeout_s=1.0
    ) as agent, ThreadPoolExecutor(1) as pool:  # fmt: skip
        client = AgentClient(socket_path=agent.socket, timeout=30)
        first = pool.submit(client.classify, "tiny", image_bytes("PNG", LARGE))
        assert held.large_entered.wait(20)
        small = client.classify("tiny", image_bytes("JPEG", SMALL))  # fits beside it
        assert small["model_name"] == "tiny"
        with pytest.raises(AgentError) as caught:
            client.classify("tiny", image_bytes("PNG", LARGE))
        held.release.set()
        assert first.result(30)["model_name"] == "tiny"
    assert caught.value.status == 503
    assert "max_decoding_pixels = 15000" in str(caught.value)
    assert held.most_large_inside == 1  # the refused one never reached the decoder


def test_images_one_after_another_all_pass(tmp_path: Path) -> None:
    """The control: the budget refuses nothing that does not overlap."""
    with tiny_agent(tmp_path, max_image_pixels=12_000, max_decoding_pixels=12_000) as agent:
        client = AgentClient(socket_path=agent.socket, timeout=30)
        for _ in range(3):
            assert client.classify("tiny", image_bytes("PNG", LARGE))["model_name"] == "tiny"
        with pytest.raises(AgentError) as caught:  # the per-image limit, now a key too
            client.classify("tiny", image_bytes("PNG", (121, 100)))
    assert caught.value.status == 400 and "exceeds the limit of 12000" in str(caught.value)


def test_a_budget_below_one_largest_image_is_a_config_error() -> None:
    from edgeagent.config import parse_config

    with pytest.raises(ConfigError) as caught:
        parse_config("[server]\nmax_image_pixels = 1000\nmax_decoding_pixels = 999\n")
    assert "[server] max_decoding_pixels: must be at least max_image_pixels" in str(caught.value)
