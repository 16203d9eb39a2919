"""A MindSpore network (``file.py:Cell`` + a ``.ckpt``, or a ``.mindir``) exported to ONNX.

MindSpore is a build-time tool in an environment of its own (``.venv-ms``, scripts/setup.sh's
"MindSpore environment" step, pinned in scripts/requirements-mindspore.txt), never an agent
dependency. The packager runs this file by its path there, twice:

- ``export``: MindSpore's own ONNX exporter (``mindspore.export(..., file_format="ONNX")``),
  with batch 1 (what it traces), inputs and outputs renamed ``input``/``output``;
- ``predict``: MindSpore's own answers to the packager's validation feeds, which the exported
  ONNX (the reference every variant is judged against) must reproduce within fp32 tolerance,
  or the package is refused: the framework, not its export, is the ground truth.

The exported batch dimension is opened here (with onnx) when the graph answers a batch of
two as it answers each row alone; a graph that bakes its batch in stays at 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path in .venv-ms, which has MindSpore but not edgeagent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from edgeagent.packaging.errors import PackagingError

PYTHON_ENV = "EDGEAGENT_MINDSPORE_PYTHON"  # a Python with mindspore + onnx, instead of .venv-ms
CHECKOUT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-ms" / "bin" / "python"
SETUP_STEP = "scripts/setup.sh (its step 'MindSpore environment (.venv-ms)')"
TIMEOUT_S = 900.0
# MindSpore's and onnxruntime's fp32 kernels differ in summation order: what one fp32
# computation may differ from another by, relative to the outputs' scale.
FP32_RTOL = 1e-4
_NOISE = ("[WARNING]", "[INFO]", "deprecated")
STACKED = ".stacked"  # packaging.measure's mark of a feeds file holding whole feeds


def is_mindspore_source(spec: str, weights: Path | None) -> bool:
    """A ``.mindir`` file, or a ``file.py:Cell`` whose weights are a MindSpore ``.ckpt``."""
    if spec.lower().endswith(".mindir"):
        return True
    return ".py:" in spec and weights is not None and weights.suffix.lower() == ".ckpt"


def mindspore_python(checkout: Path = CHECKOUT_PYTHON) -> str:
    """$EDGEAGENT_MINDSPORE_PYTHON, else the checkout's .venv-ms; else say how to make one."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise PackagingError(f"${PYTHON_ENV}={named}: no such file")
        return named
    if checkout.is_file():
        return str(checkout)
    raise PackagingError(
        "MindSpore sources need MindSpore, which the agent's environment does not have: run "
        f"{SETUP_STEP}, or set ${PYTHON_ENV} to a Python with the packages of "
        "scripts/requirements-mindspore.txt"
    )


def export_mindspore(
    spec: str,
    weights: Path | None,
    size: tuple[int, int] | None,
    channels: int,
    work: Path,
    progress: Any,
) -> Path:
    """The ONNX MindSpore exports for ``spec`` (batch opened where the graph allows)."""
    if spec.lower().endswith(".mindir"):
        if not Path(spec).is_file():
            raise PackagingError(f"{spec}: no such file")
        stem = Path(spec).stem
    else:
        path = Path(spec.rpartition(":")[0])
        if not path.is_file():
            raise PackagingError(f"{spec}: expected FILE.py:CELL naming an existing file")
        if weights is None or not weights.is_file():
            raise PackagingError(f"--weights {weights}: no such file")
        stem = path.stem
    if size is None:  # the exporter traces one sample of the input's shape
        raise PackagingError(
            f"{spec}: pass --input-size HEIGHT,WIDTH (and --channels) for MindSpore's export"
        )
    progress(f"MindSpore export to ONNX: {spec}")
    raw = work / f"{stem}.mindspore.onnx"
    job = {
        "spec": spec,
        "weights": None if weights is None else str(weights),
        "shape": [1, channels, *size],
        "out": str(raw),
    }
    _run("export", job, work, f"{spec}: MindSpore's ONNX export failed")
    out = work / f"{stem}.onnx"
    open_batch(raw, out)
    return out


def check_against_mindspore(
    spec: str,
    weights: Path | None,
    feeds: Path,
    names: tuple[list[str], list[str]],
    reference: dict[str, np.ndarray],
    work: Path,
    progress: Any,
) -> dict[str, Any]:
    """MindSpore's own answers to the validation feeds against the exported reference's.

    Returns the figures for validation.json; PackagingError when the export disagrees with
    the framework beyond fp32 tolerance.
    """
    progress("validation: MindSpore's own outputs against the exported ONNX")
    answers = work / "mindspore-answers.npz"
    job = {
        "spec": spec,
        "weights": None if weights is None else str(weights),
        "feeds": str(feeds),
        "input_names": names[0],
        "out": str(answers),
    }
    _run("predict", job, work, f"{spec}: MindSpore could not run the validation feeds")
    with np.load(answers) as data:
        theirs = [data[f"out_{i}"] for i in range(len(data.files))]
    worst = 0.0
    for name, own in zip(names[1], theirs, strict=False):
        ours = reference[name].reshape(own.shape)
        scale = max(float(np.max(np.abs(own))), 1.0)
        worst = max(worst, float(np.max(np.abs(ours - own))) / scale)
    if worst > FP32_RTOL:
        raise PackagingError(
            f"{spec}: the exported ONNX answers differently from MindSpore itself (largest "
            f"error {worst:.2e} of the outputs' scale, fp32 allows {FP32_RTOL:g}): the export "
            "is wrong for this network; export it with mindspore.export to ONNX yourself to see"
        )
    return {"framework": "mindspore", "rows": len(theirs[0]), "max_relative_error": worst}


def open_batch(raw: Path, out: Path) -> None:
    """``raw`` with its first dimension open, renamed ``input``/``output``, when a batch of two
    answers as its rows do; else as exported (batch 1), renamed."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(raw))
    _rename(model)
    onnx.save(model, str(out))
    fixed = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    dims = model.graph.input[0].type.tensor_type.shape.dim
    if len(model.graph.input) != 1 or not dims or dims[0].dim_value != 1:
        return
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    staged = out.with_suffix(".batch.onnx")
    onnx.save(model, str(staged))
    shape = [1, *(d.dim_value for d in dims[1:])]
    rows = np.random.default_rng(0).standard_normal((2, *shape[1:])).astype(np.float32)
    try:
        batched = ort.InferenceSession(str(staged), providers=["CPUExecutionProvider"])
        together = batched.run(None, {"input": rows})
    except Exception:
        staged.unlink()
        return
    alone = [fixed.run(None, {"input": rows[i : i + 1]}) for i in range(2)]
    for index, value in enumerate(together):
        if not np.allclose(value, np.concatenate([a[index] for a in alone]), atol=1e-5):
            staged.unlink()
            return
    staged.replace(out)


def _rename(model: Any) -> None:
    """The exporter's names (``x``, ``12``) become the packager's ``input``/``output``."""
    ins = [v.name for v in model.graph.input]
    outs = [v.name for v in model.graph.output]
    new = {}
    if len(ins) == 1:
        new[ins[0]] = "input"
    if len(outs) == 1:
        new[outs[0]] = "output"
    for value in (*model.graph.input, *model.graph.output):
        value.name = new.get(value.name, value.name)
    for node in model.graph.node:
        node.input[:] = [new.get(n, n) for n in node.input]
        node.output[:] = [new.get(n, n) for n in node.output]


def _run(mode: str, job: dict, work: Path, what: str) -> None:
    job_file = work / f"mindspore-{mode}.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    command = [mindspore_python(), str(Path(__file__).resolve()), mode, str(job_file)]
    env = {**os.environ, "GLOG_v": "3"}  # MindSpore's INFO/WARNING lines stay out of errors
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise PackagingError(f"{what}: still running after {TIMEOUT_S:g} s") from None
    if done.returncode != 0:
        lines = [
            line.strip()
            for line in done.stderr.splitlines()
            if line.strip() and not any(n in line for n in _NOISE)
        ]
        raise PackagingError(f"{what}: {' | '.join(lines[-6:]) or 'no message'}"[:1500])


# -- the part that runs in the MindSpore environment -------------------------------------------


def _network(spec: str, weights: str | None) -> Any:
    """The Cell in eval mode: a .mindir as a GraphCell, else FILE.py:CELL with the checkpoint."""
    import mindspore as ms

    from edgeagent.packaging.factories import import_factory

    if spec.lower().endswith(".mindir"):
        return ms.nn.GraphCell(ms.load(spec))
    make = import_factory(spec, by_name=True)  # MindSpore parses the module by name
    network = make()
    if weights is not None:
        missing, _ = ms.load_param_into_net(network, ms.load_checkpoint(weights))
        if missing:
            raise SystemExit(f"{weights}: lacks the parameters {', '.join(missing[:5])}")
    network.set_train(False)
    return network


def _export(job: dict) -> None:
    import mindspore as ms

    network = _network(job["spec"], job["weights"])
    sample = ms.Tensor(np.zeros(job["shape"], np.float32))
    ms.export(network, sample, file_name=job["out"].removesuffix(".onnx"), file_format="ONNX")


def _predict(job: dict) -> None:
    import mindspore as ms

    network = _network(job["spec"], job["weights"])
    with np.load(job["feeds"]) as data:
        inputs = data[job["input_names"][0]]
        stacked = STACKED in data.files  # one whole feed a row: the batch is fixed at 1
    rows = [inputs[i] if stacked else inputs[i : i + 1] for i in range(len(inputs))]
    answers = [network(ms.Tensor(np.ascontiguousarray(row))) for row in rows]
    first = answers[0] if isinstance(answers[0], tuple | list) else [answers[0]]
    count = len(first)
    outputs = {}
    for index in range(count):
        parts = [(a[index] if isinstance(a, tuple | list) else a).asnumpy() for a in answers]
        outputs[f"out_{index}"] = np.concatenate(parts)
    np.savez(job["out"], allow_pickle=False, **outputs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="MindSpore export and prediction")
    parser.add_argument("mode", choices=("export", "predict"))
    parser.add_argument("job", type=Path)
    args = parser.parse_args(argv)
    job = json.loads(args.job.read_text(encoding="utf-8"))
    (_export if args.mode == "export" else _predict)(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
