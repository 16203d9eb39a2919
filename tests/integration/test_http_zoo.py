"""Real zoo models served over HTTP answer exactly what the same model answers in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton

from edgeagent.api.client import AgentClient
from edgeagent.models.package import load_package
from edgeagent.models.preprocess import preprocess_image, top_k
from edgeagent.models.session import open_variant
from tests.support.http_agent import AgentServer, triton_client

MODELS = ("mobilenet_v2", "digits_mnv3")


@pytest.fixture(scope="module")
def agent(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    server = AgentServer(tmp_path_factory.mktemp("zoo"), [zoo / name for name in MODELS])
    server.start()
    yield server
    server.stop()


def _samples(zoo: Path, name: str) -> list[Path]:
    pattern = "digit_*" if name.startswith("digits") else "[!d]*.*[gG]"
    return sorted(p for p in (zoo / "samples").glob(pattern) if p.suffix in (".jpg", ".png"))


@pytest.mark.parametrize("name", MODELS)
def test_classify_matches_the_in_process_pipeline(zoo: Path, agent: AgentServer, name: str) -> None:
    package = load_package(zoo / name)
    client = AgentClient(socket_path=agent.socket, timeout=30)
    backend = client.status()["models"][name]["versions"][package.version]
    session = open_variant(package, backend["runtime"], backend["precision"], threads=1)
    assert package.preprocess is not None
    try:
        for image in _samples(zoo, name):
            data = image.read_bytes()
            served = client.classify(name, data, top_k=3)
            logits = session.run(
                {package.inputs[0].name: preprocess_image(data, package.preprocess)}
            )
            local = top_k(logits[package.outputs[0].name][0], package.labels, 3, True)
            assert served["labels"] == [p.label for p in local], image.name
            np.testing.assert_allclose(served["scores"], [p.score for p in local], atol=1e-4)
            assert served["backend"] == backend["runtime"]
            if name.startswith("digits"):  # digit_3.jpg shows a 3
                assert served["labels"][0] == image.stem.removeprefix("digit_")
    finally:
        session.close()


def test_tritonclient_batch_of_distinct_images(zoo: Path, agent: AgentServer) -> None:
    """Each row of a served batch is the answer for its own image (no mixing across rows)."""
    package = load_package(zoo / "mobilenet_v2")
    assert package.preprocess is not None
    images = [preprocess_image(p.read_bytes(), package.preprocess) for p in _samples(zoo, "x")]
    batch = np.concatenate(images)
    client = triton_client(agent)
    try:
        tensor = triton.InferInput(package.inputs[0].name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        served = client.infer("mobilenet_v2", [tensor]).as_numpy(package.outputs[0].name)
    finally:
        client.close()
    one_by_one = AgentClient(socket_path=agent.socket)
    for row, image in zip(served, images, strict=True):
        alone = one_by_one.infer("mobilenet_v2", {package.inputs[0].name: image})
        expected = alone.outputs[package.outputs[0].name][0]
        assert row.argmax() == expected.argmax()
        np.testing.assert_allclose(row, expected, atol=1e-3)
