"""The cloud manifests: the Helm chart rendered by helm and checked against Kubernetes' own
schemas (kubernetes-validate), KServe's ServingRuntime, and the agent run the way that runtime
runs it (models from the storage initializer's directory, v2 on HTTP and gRPC, health, drain)."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes_validate
import pytest
import tritonclient.grpc as triton_grpc
import yaml

from devtools.agent_process import spawn_agent
from devtools.pki import make_pki
from devtools.ports import free_port
from devtools.tiny import write_tiny_package
from edgeagent.commands.config import check
from tests.support.helpers import REPO

pytestmark = pytest.mark.timeout(180)

CHART = REPO / "deploy" / "helm" / "edgeagent"
SERVING_RUNTIME = REPO / "deploy" / "kserve" / "servingruntime.yaml"
KUBERNETES = "1.31.0"  # the oldest release the chart is checked against (kubeVersion >=1.25)


def helm() -> str:
    found = shutil.which("helm") or str(REPO / ".tools" / "bin" / "helm")
    if not Path(found).is_file():
        pytest.skip("helm is not installed (scripts/install_helm.sh)")
    return found


def render(*values: str) -> list[dict[str, Any]]:
    """``helm template`` with ``--set`` ``values``: the manifests a cluster would get."""
    done = subprocess.run(
        [helm(), "template", "demo", str(CHART), *(f"--set={v}" for v in values)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = {doc["kind"]: doc for doc in docs}
    assert len(kinds) == len(docs), "one object of each kind"
    return kinds


def checked_config(text: str, root: Path) -> list[str]:
    """``config check``'s problems with the manifest's config, its in-pod paths moved under
    ``root`` (a token file, a package as the models directory, TLS files from a test CA)."""
    pod = root / "pod"
    (pod / "etc" / "token").mkdir(parents=True, exist_ok=True)
    (pod / "etc" / "token" / "token").write_text("k8s-test-token\n")
    write_tiny_package(pod / "mnt" / "models")
    pki = make_pki(pod / "pki")
    (pod / "etc" / "tls").mkdir(exist_ok=True)
    files = {"tls.crt": pki.server_cert, "tls.key": pki.server_key, "ca.crt": pki.ca}
    for name, source in files.items():
        shutil.copyfile(source, pod / "etc" / "tls" / name)
    local = text.replace("/etc/edgeagent/", f"{pod}/etc/")
    local = local.replace("/mnt/models", f"{pod}/mnt/models")
    config = root / "agent.toml"
    config.write_text(local)
    return check(config)


@pytest.mark.parametrize(
    "values",
    [
        (),
        ("tls.secret=edgeagent-tls", "tls.clientCA=true", "autoscaling.enabled=false"),
        ("grpc.enabled=false", "podDisruptionBudget.enabled=false"),
    ],
)
def test_the_chart_renders_objects_kubernetes_schemas_accept(
    values: tuple[str, ...], tmp_path: Path
) -> None:
    docs = render(*values)
    for doc in docs:  # strict: an unknown or misspelt field fails too
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    kinds = by_kind(docs)
    expected = {"ConfigMap", "Deployment", "Service"}
    expected |= set() if "autoscaling.enabled=false" in values else {"HorizontalPodAutoscaler"}
    expected |= set() if "podDisruptionBudget.enabled=false" in values else {"PodDisruptionBudget"}
    assert set(kinds) == expected
    deployment = kinds["Deployment"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert kinds["Service"]["spec"]["selector"] == selector
    if "PodDisruptionBudget" in kinds:
        assert kinds["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == selector
    if "HorizontalPodAutoscaler" in kinds:
        hpa = kinds["HorizontalPodAutoscaler"]["spec"]
        assert hpa["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
        assert hpa["metrics"][0]["type"] == "Pods"  # a custom per-pod metric, not CPU
        assert hpa["metrics"][0]["pods"]["metric"]["name"] == "edgeagent_queue_depth"
        assert "replicas" not in deployment["spec"]  # the HPA owns the count
    pod = deployment["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > 30  # longer than the drain
    ports = {p["name"]: p["containerPort"] for p in pod["containers"][0]["ports"]}
    assert ports == (
        {"http": 8080} if "grpc.enabled=false" in values else {"http": 8080, "grpc": 8081}
    )
    assert checked_config(kinds["ConfigMap"]["data"]["agent.toml"], tmp_path) == []


def test_helm_lint_is_clean() -> None:
    done = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_chart_without_tls_off_would_be_refused_by_the_agent(tmp_path: Path) -> None:
    """The chart's tls = "off" is load-bearing: without it the agent refuses its own config."""
    text = by_kind(render())["ConfigMap"]["data"]["agent.toml"]
    problems = checked_config(text.replace('tls = "off"\n', ""), tmp_path)
    assert any("[server] tls: plain TCP on the non-loopback address" in p for p in problems)


def serving_runtime() -> tuple[dict[str, Any], dict[str, Any]]:
    config_map, runtime = list(yaml.safe_load_all(SERVING_RUNTIME.read_text()))
    return config_map, runtime


def test_the_serving_runtime_meets_kserves_contract(tmp_path: Path) -> None:
    config_map, runtime = serving_runtime()
    kubernetes_validate.validate(config_map, KUBERNETES, strict=True)
    assert (runtime["apiVersion"], runtime["kind"]) == (
        "serving.kserve.io/v1alpha1",
        "ServingRuntime",
    )
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    assert spec["supportedModelFormats"][0]["name"] == "edgeagent"
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container"  # the name KServe merges predictor settings into
    assert "/mnt/models" in container["args"]
    # The pod part of the runtime is a pod spec: Kubernetes' schema checks it strictly.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "edgeagent"},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    kubernetes_validate.validate(pod, KUBERNETES, strict=True)
    text = config_map["data"]["agent.toml"]
    assert "tcp_port = 8080" in text and "port = 8081" in text
    assert checked_config(text, tmp_path) == []


@pytest.fixture
def kserve_pod(tmp_path: Path) -> Iterator[tuple[subprocess.Popen, int, int]]:
    """The agent started with the ServingRuntime's arguments and config, on loopback and free
    ports instead of the pod's 0.0.0.0:8080/8081, /mnt/models a package directory."""
    config_map, runtime = serving_runtime()
    http_port, grpc_port = free_port(), free_port()
    text = (
        config_map["data"]["agent.toml"]
        .replace("0.0.0.0", "127.0.0.1")
        .replace("tcp_port = 8080", f"tcp_port = {http_port}")
        .replace("port = 8081", f"port = {grpc_port}")
        .replace("[grpc]\n", f"[grpc]\nunix_socket = '{tmp_path / 'grpc.sock'}'\n")
    )
    assert checked_config(text, tmp_path) == []
    pod = tmp_path / "pod"
    args = [
        str(tmp_path / "agent.toml") if a == "/etc/edgeagent/agent.toml" else a
        for a in runtime["spec"]["containers"][0]["args"][1:]  # after "run"
    ]
    args = [str(pod / "mnt" / "models") if a == "/mnt/models" else a for a in args]
    process = spawn_agent(
        [*args, "--socket", str(tmp_path / "agent.sock")],
        state=tmp_path / "state",
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("edgeagent serving tiny"), first
    try:
        yield process, http_port, grpc_port
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdout.close()


async def test_the_agent_runs_as_the_serving_runtime_says(kserve_pod) -> None:
    process, http_port, grpc_port = kserve_pod
    headers = {"Authorization": "Bearer k8s-test-token"}
    async with aiohttp.ClientSession(f"http://127.0.0.1:{http_port}", headers=headers) as http:
        for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/tiny/ready"):
            async with http.get(path) as answer:
                assert answer.status == 200, path
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        token = {"authorization": "Bearer k8s-test-token"}
        assert client.is_server_live(headers=token) and client.is_server_ready(headers=token)
    finally:
        client.close()
    process.send_signal(signal.SIGTERM)  # the kubelet's stop: drain, then exit 0
    assert process.wait(timeout=60) == 0
