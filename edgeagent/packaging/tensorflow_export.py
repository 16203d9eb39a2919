"""A TensorFlow model (a SavedModel directory or a frozen ``.pb`` graph) converted to ONNX.

TensorFlow is a build-time tool in an environment of its own (``.venv-tf``, scripts/setup.sh's
"TensorFlow converter" step, pinned in scripts/requirements-tf.txt): it is 1.7 GB with its
dependencies and the agent never needs it, since it serves the ONNX that tf2onnx writes. So the
packager runs two things in that environment as processes of their own: this file by its path
(``inspect``: a frozen graph's placeholders, its unconsumed nodes and the TF Object Detection
API's resize size, printed as JSON) and ``python -m tf2onnx.convert``. What tf2onnx wrote is then
made packageable here, with onnx only (``tf_onnx.finish``).

A frozen graph does not say which of its nodes are outputs: the unconsumed ones are taken when
they are few, the TF Object Detection API's four by their names, else ``--tf-outputs`` must say.

A SavedModel is loaded for inference only: its serving signature's graph, through the
MetaGraph loader that TensorFlow Serving uses, with the variables frozen into constants
(``freeze``), then converted as a frozen graph with the signature's own input and output names.
TensorFlow's object loader (what tf2onnx's SavedModel path uses) rebuilds every saved object,
and fails on a model saved with its optimizer, whose slot variables TF 2.16+ cannot rebuild
(``'_UserObject' object has no attribute 'add_slot'``); it is the fallback where the signature
does not convert, and what ``--tf-inputs``/``--tf-outputs`` use.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path in .venv-tf, which has TensorFlow but not edgeagent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from edgeagent.packaging.errors import PackagingError, converter_message

TF_OPSET = 17  # read by onnxruntime and OpenVINO alike; tf2onnx's best-tested range
PYTHON_ENV = "EDGEAGENT_TF_PYTHON"  # a Python with tensorflow + tf2onnx, instead of .venv-tf
TIMEOUT_ENV = "EDGEAGENT_TF_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 1800.0  # a large detection graph converts in ~20 s on 2 cores
MAX_DISCOVERED_OUTPUTS = 8  # more unconsumed nodes than this: ask --tf-outputs, do not guess
CHECKOUT_PYTHON = Path(__file__).resolve().parents[2] / ".venv-tf" / "bin" / "python"
SETUP_STEP = "scripts/setup.sh (its step 'TensorFlow converter environment (.venv-tf)')"
# Ops that end a graph without being an answer: constants, bookkeeping, savers.
_NOT_OUTPUTS = {"Const", "NoOp", "Assert", "Placeholder", "PlaceholderWithDefault", "SaveV2"}
# TensorFlow's resize ops and the [preprocess] resize_filter that resizes as each does.
RESIZE_FILTERS = {
    "ResizeBilinear": "bilinear",
    "ResizeNearestNeighbor": "nearest",
    "ResizeBicubic": "bicubic",
    "ResizeArea": "area",
}
_RESIZE_OPS = set(RESIZE_FILTERS)
_TF_NOISE = ("I0000", "W0000", "oneDNN", "cpu_feature_guard", "All log messages before", "rebuild")


@dataclass(frozen=True)
class GraphFacts:
    """What a frozen graph says about its interface (from ``inspect`` in the TF environment)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]  # unconsumed nodes that could be answers
    resize: tuple[int, int] | None  # the TF OD API's fixed resize (height, width), if any
    resize_filter: str | None = None  # that resize's filter (its op: ResizeBicubic → bicubic)


def is_tensorflow_source(spec: str) -> bool:
    """A frozen graph (``.pb``) or a SavedModel directory (holding ``saved_model.pb``)."""
    path = Path(spec)
    if path.is_dir():
        return (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file()
    return path.suffix.lower() == ".pb"


def export_tensorflow(
    spec: str,
    size: tuple[int, int] | None,
    inputs: Sequence[str],
    outputs: Sequence[str],
    work: Path,
    progress: Any,
) -> Path:
    """Convert ``spec`` to ONNX in ``work``; the packageable ONNX's path.

    ``size`` (--input-size) pins an open image height and width; without it a TF OD API graph's
    own resize size is used. ``inputs``/``outputs`` (--tf-inputs/--tf-outputs) name the graph's
    tensors where discovery cannot.
    """
    from edgeagent.packaging.tf_onnx import finish

    source = Path(spec)
    if source.is_dir() and not is_tensorflow_source(spec):
        raise PackagingError(f"{source}: a directory without saved_model.pb is not a SavedModel")
    if not source.exists():
        raise PackagingError(f"{source}: no such file or directory")
    python = tensorflow_python()
    stem = source.resolve().name if source.is_dir() else source.stem
    raw, out = work / f"{stem}.tf2onnx.onnx", work / f"{stem}.onnx"
    command = [python, "-m", "tf2onnx.convert", "--opset", str(TF_OPSET), "--output", str(raw)]
    facts = None
    if source.is_dir():
        command += ["--saved-model", str(source)]
        if inputs:
            command += ["--inputs", ",".join(_tensor(n) for n in inputs)]
        if outputs:
            command += ["--outputs", ",".join(_tensor(n) for n in outputs)]
    else:
        facts = inspect_graph(python, source)
        chosen_in = tuple(inputs) or facts.inputs
        chosen_out = tuple(outputs) or _outputs(source, facts)
        if not chosen_in:
            raise PackagingError(f"{source}: the graph has no Placeholder: pass --tf-inputs NAME")
        command += ["--graphdef", str(source)]
        command += ["--inputs", ",".join(_tensor(n) for n in chosen_in)]
        command += ["--outputs", ",".join(_tensor(n) for n in chosen_out)]
    progress(f"TensorFlow → ONNX (tf2onnx, opset {TF_OPSET}): {source}")
    if source.is_dir() and not inputs and not outputs:
        _saved_model(python, source, work, raw, command, progress)
    else:
        _run(command, f"{source}: tf2onnx could not convert the graph")
    pinned = size or (facts.resize if facts is not None else None)
    if size is None and pinned is not None:
        progress(f"input size {pinned[0]}×{pinned[1]} from the graph's own resize")
    recorded = {"resize_filter": facts.resize_filter} if facts and facts.resize_filter else {}
    return finish(raw, out, pinned, progress, recorded)


def _saved_model(
    python: str, source: Path, work: Path, raw: Path, command: list[str], progress: Any
) -> None:
    """A SavedModel for inference: its serving signature frozen and converted (its training
    objects never loaded), else tf2onnx's own SavedModel loader, which rebuilds every object."""
    try:
        signature = _signature_command(python, source, work, raw)
        progress(f"{source.name}: its serving signature, for inference (variables frozen)")
        _run(signature, f"{source}: tf2onnx could not convert its serving signature")
        return
    except PackagingError as exc:
        progress(f"the serving signature did not convert ({_first_line(exc)}): the whole model")
    _run(command, f"{source}: tf2onnx could not convert the graph")


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1][-160:] if lines else type(exc).__name__


def _signature_command(python: str, source: Path, work: Path, raw: Path) -> list[str]:
    """Freeze the SavedModel's serving signature (``freeze`` in the TF environment) and the
    tf2onnx command that converts it, naming its tensors as the signature names them."""
    frozen = work / f"{source.resolve().name}.frozen.pb"
    text = _run(
        [python, str(Path(__file__).resolve()), "freeze", str(source), str(frozen)],
        f"{source}: its serving signature cannot be loaded for inference either",
    )
    try:
        signature = json.loads(text.strip().splitlines()[-1])
        ins, outs = signature["inputs"], signature["outputs"]
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise PackagingError(f"{source}: the signature reader answered {text[-300:]!r}") from exc
    return [
        python,
        "-m",
        "tf2onnx.convert",
        "--opset",
        str(TF_OPSET),
        "--output",
        str(raw),
        "--graphdef",
        str(frozen),
        "--inputs",
        ",".join(ins.values()),
        "--outputs",
        ",".join(outs.values()),
        "--rename-inputs",
        ",".join(ins),
        "--rename-outputs",
        ",".join(outs),
    ]


def tensorflow_python(checkout: Path = CHECKOUT_PYTHON) -> str:
    """The Python that converts: $EDGEAGENT_TF_PYTHON, this one if it has TensorFlow and
    tf2onnx, else the checkout's .venv-tf; PackagingError naming the set-up step otherwise."""
    named = os.environ.get(PYTHON_ENV)
    if named:
        if not Path(named).is_file():
            raise PackagingError(f"${PYTHON_ENV}={named}: no such file")
        return named
    if all(importlib.util.find_spec(m) is not None for m in ("tensorflow", "tf2onnx")):
        return sys.executable
    if checkout.is_file():
        return str(checkout)
    raise PackagingError(
        f"TensorFlow sources need TensorFlow and tf2onnx, which the agent's environment does not "
        f"have: run {SETUP_STEP}, or set ${PYTHON_ENV} to a Python with the packages of "
        "scripts/requirements-tf.txt"
    )


def inspect_graph(python: str, path: Path) -> GraphFacts:
    """Run ``inspect`` on ``path`` in the TF environment."""
    text = _run(
        [python, str(Path(__file__).resolve()), "inspect", str(path)], f"{path}: unreadable"
    )
    try:
        data = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise PackagingError(f"{path}: the graph inspector answered {text[-300:]!r}") from exc
    resize = data.get("resize")
    return GraphFacts(
        tuple(data["inputs"]),
        tuple(data["outputs"]),
        tuple(resize) if resize else None,
        RESIZE_FILTERS.get(data.get("resize_op") or ""),
    )


def _outputs(path: Path, facts: GraphFacts) -> tuple[str, ...]:
    from edgeagent.packaging.tf_onnx import OD_API_OUTPUTS  # not at the top: the TF side is light

    if set(OD_API_OUTPUTS) <= set(facts.outputs):
        return OD_API_OUTPUTS  # the head's order, whatever order the graph lists them in
    if 0 < len(facts.outputs) <= MAX_DISCOVERED_OUTPUTS:
        return facts.outputs
    listed = ", ".join(facts.outputs[:20]) + (" …" if len(facts.outputs) > 20 else "")
    raise PackagingError(
        f"{path}: cannot tell the graph's outputs ({len(facts.outputs)} unconsumed nodes: "
        f"{listed or 'none'}): pass --tf-outputs NAME[,NAME…]"
    )


def _tensor(name: str) -> str:
    """A node name as tf2onnx wants a tensor: ``name:0`` unless an output index is given."""
    return name if ":" in name else f"{name}:0"


def _timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    try:
        return float(value) if value else DEFAULT_TIMEOUT_S
    except ValueError:
        raise PackagingError(f"${TIMEOUT_ENV}={value!r}: a number of seconds") from None


def _run(command: list[str], what: str) -> str:
    """Run ``command``; its stdout, or PackagingError with its own useful words."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=_timeout(), check=False
        )
    except subprocess.TimeoutExpired:
        raise PackagingError(f"{what}: still running after {_timeout():g} s") from None
    if done.returncode != 0:
        raise PackagingError(f"{what}: {converter_message(RuntimeError(_useful(done.stderr)))}")
    return done.stdout


def _useful(stderr: str) -> str:
    """The converter's error without TensorFlow's start-up chatter: the traceback's last lines
    (where tf2onnx and TensorFlow say what failed) and any ERROR log lines."""
    lines = [line for line in stderr.splitlines() if not any(n in line for n in _TF_NOISE)]
    errors = [line for line in lines if " - ERROR - " in line]
    tail = lines[-12:]
    return "\n".join(errors + [line for line in tail if line not in errors]) or "no message"


# -- the part that runs in the TensorFlow environment ------------------------------------------


def _inspect(path: Path) -> dict[str, Any]:
    """Placeholders, unconsumed nodes and the OD API's resize size of a frozen graph."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(path.read_bytes())
    consumed = {name.lstrip("^").split(":")[0] for node in graph.node for name in node.input}
    inputs = [n.name for n in graph.node if n.op == "Placeholder"]
    outputs = [n.name for n in graph.node if n.name not in consumed and n.op not in _NOT_OUTPUTS]
    resize = _resize(graph)
    return {
        "inputs": inputs,
        "outputs": outputs,
        "resize": resize[0] if resize else None,
        "resize_op": resize[1] if resize else None,
    }


def _resize(graph: Any) -> tuple[list[int], str] | None:
    """The OD API's fixed resize: a Resize* op under ``Preprocessor/`` whose size is a Const of
    two ints (``Preprocessor/map/while/ResizeImage/stack``: [300, 300] for SSDLite), and the
    op (which filter it resizes with)."""
    import tensorflow as tf

    constants = {n.name: n for n in graph.node if n.op == "Const"}
    for node in graph.node:
        if not (node.op in _RESIZE_OPS and node.name.startswith("Preprocessor/")):
            continue
        size = constants.get(node.input[1].split(":")[0]) if len(node.input) > 1 else None
        if size is None:
            continue
        value = tf.make_ndarray(size.attr["value"].tensor).reshape(-1).tolist()
        if len(value) == 2 and all(isinstance(v, int) and 0 < v <= 8192 for v in value):
            return [int(v) for v in value], str(node.op)
    return None


SERVING_TAG, SERVING_SIGNATURE = "serve", "serving_default"


def _freeze(path: Path, out: Path) -> dict[str, Any]:
    """The serving signature of a SavedModel as a frozen graph at ``out``, loaded through the
    MetaGraph (never the training objects), and its inputs and outputs: signature key → the
    graph tensor, in the signature's key order."""
    import tensorflow as tf

    with tf.Graph().as_default() as graph, tf.compat.v1.Session() as session:
        meta = tf.compat.v1.saved_model.loader.load(session, [SERVING_TAG], str(path))
        if SERVING_SIGNATURE not in meta.signature_def:
            known = ", ".join(meta.signature_def) or "none"
            raise SystemExit(f"no {SERVING_SIGNATURE!r} signature (signatures: {known})")
        signature = meta.signature_def[SERVING_SIGNATURE]
        inputs = {key: signature.inputs[key].name for key in sorted(signature.inputs)}
        outputs = {key: signature.outputs[key].name for key in sorted(signature.outputs)}
        nodes = sorted({name.split(":")[0] for name in outputs.values()})
        frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
            session, graph.as_graph_def(), nodes
        )
    out.write_bytes(frozen.SerializeToString())
    return {"inputs": inputs, "outputs": outputs}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 3 and args[0] == "freeze":
        print(json.dumps(_freeze(Path(args[1]), Path(args[2]))))
        return 0
    if len(args) != 2 or args[0] != "inspect":
        print(
            "usage: tensorflow_export.py inspect FROZEN_GRAPH.pb | freeze SAVED_MODEL OUT.pb",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(_inspect(Path(args[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
