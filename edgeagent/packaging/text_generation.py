"""``edgeagent package model.gguf …``: a language model's package, every variant judged by its task.

Each GGUF file given is one variant (a quantization of one model). The highest-precision one
(most bits per weight) is the reference; every other one is run on the same golden chats and
held-out text and kept only when

    agreement  = the share of the reference's greedy tokens it repeats before the first
                 different one (mean over the golden chats) ≥ ``min_agreement``, and
    perplexity on the held-out text ≤ ``max_perplexity_ratio`` × the reference's.

A Hugging Face model folder is converted first (``packaging.hf_gguf``: an f16 GGUF, the
reference) and quantized by llama.cpp's own quantizer (``--quantize``, q8_0 by default); the
files are then judged as if they had been given.

A dropped variant is reported with its figures and never written. The model is driven through
the generative runtime plugin (``runtimes.llama_cpp``) and the chat rendered by the language
plane's own template code, so what is recorded is what a device will replay in its health
check (``models.text_golden``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeagent.models.manifest_writer import write_table
from edgeagent.models.package import PackageError, file_sha256, load_package
from edgeagent.models.text_golden import (
    GOLDEN_FILE,
    GoldenPrompt,
    TextGolden,
    agreement,
    answer_all,
    perplexity,
)
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.gguf_source import GgufFacts, is_hugging_face_folder, read_gguf
from edgeagent.packaging.hf_gguf import convert_hf_folder
from edgeagent.packaging.text_prompts import GOLDEN_CHATS, HELD_OUT
from edgeagent.runtimes.base import RuntimeLoadError, RuntimeUnavailable
from edgeagent.runtimes.generative import GenerativeLoadRequest, GenerativeSession

RUNTIME = "llama_cpp"
OPENVINO = "openvino_genai"
JUDGE_CONTEXT = 1024  # enough for a golden chat or the held-out text, small for memory
Progress = Callable[[str], None]


@dataclass(frozen=True)
class TextRules:
    min_agreement: float = 0.8
    max_perplexity_ratio: float = 1.15


@dataclass(frozen=True)
class TextOptions:
    name: str | None = None
    version: str = "1.0.0"
    description: str = ""
    max_tokens: int = 16  # greedy tokens per golden chat
    threads: int | None = None
    quantize: tuple[str, ...] = ("q8_0",)  # of a Hugging Face folder's f16 conversion
    openvino: bool = False  # also an OpenVINO GenAI IR variant of every GGUF, judged alike


@dataclass
class Judgement:
    key: str  # llama_cpp/q4_1
    files: tuple[Path, ...]
    precision: str
    folder: str = ""  # where its files go in the package ("": beside model.toml)
    agreement: float = 1.0
    perplexity: float = 0.0
    perplexity_ratio: float = 1.0
    tokens_per_second: float = 0.0
    tokens: list[tuple[int, ...]] = field(default_factory=list)
    kept: bool = True
    why: str = ""


@dataclass(frozen=True)
class TextResult:
    out: Path
    reference: str
    judgements: tuple[Judgement, ...]
    seconds: float


def is_text_source(spec: str) -> bool:
    """A GGUF file, or a Hugging Face model folder (config.json): the language-model packager's."""
    path = Path(spec)
    return path.suffix.lower() == ".gguf" or (path.is_dir() and (path / "config.json").is_file())


def package_text_model(
    sources: Sequence[str],
    out: Path,
    options: TextOptions,
    rules: TextRules,
    progress: Progress,
) -> TextResult:
    """Judge every file, write the package of the kept ones; nothing at ``out`` on failure."""
    started = time.perf_counter()
    if out.exists() and any(out.iterdir()):
        raise PackagingError(f"{out}: already exists and is not empty: pass a new --out directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.hf-") as work:
        paths = []
        for spec in sources:
            if is_hugging_face_folder(Path(spec)):
                paths += _from_hugging_face(Path(spec), Path(work), options, progress)
                options = replace(options, name=options.name or Path(spec).resolve().name.lower())
            else:
                paths.append(Path(spec))
        return _package(paths, out, options, rules, progress, started, Path(work))


def _from_hugging_face(
    folder: Path, work: Path, options: TextOptions, progress: Progress
) -> list[Path]:
    """The folder's f16 GGUF and its quantizations, in ``work``."""
    from edgeagent.runtimes.llama_cpp import quantize

    stem = folder.resolve().name.lower()
    progress(f"{folder}: converting to GGUF (f16)")
    reference = convert_hf_folder(folder, work / f"{stem}.f16.gguf")
    files = [reference]
    for precision in options.quantize:
        progress(f"{folder}: quantizing to {precision}")
        try:
            files.append(quantize(reference, work / f"{stem}.{precision}.gguf", precision))
        except RuntimeLoadError as exc:
            raise PackagingError(str(exc)) from exc
    return files


def _package(
    paths: Sequence[Path],
    out: Path,
    options: TextOptions,
    rules: TextRules,
    progress: Progress,
    started: float,
    work: Path,
) -> TextResult:
    files = [read_gguf(path) for path in paths]
    _same_model(files)
    files.sort(key=lambda f: f.bits_per_weight, reverse=True)
    reference = files[0]
    judgements = []
    with _session(RUNTIME, (reference.path,), options.threads) as session:
        prompts = _render(reference, session)
        judgements.append(_judge(_gguf(reference), session, prompts, options, progress))
    for facts in files[1:]:
        with _session(RUNTIME, (facts.path,), options.threads) as session:
            judgements.append(_judge(_gguf(facts), session, prompts, options, progress))
    if options.openvino:
        judgements += _openvino(files, work, prompts, options, progress)
    ref = judgements[0]
    for judged in judgements[1:]:
        if judged.kept:  # not dropped already (an IR that could not be made)
            _compare(judged, ref, rules)
    for judged in judgements:
        progress(_figures(judged, ref.key))
    kept = [j for j in judgements if j.kept]
    golden = TextGolden(
        max_tokens=options.max_tokens,
        prompts=tuple(
            GoldenPrompt(
                messages=tuple(GOLDEN_CHATS[i]),
                prompt=text,
                prompt_tokens=tokens,
                tokens={j.key: j.tokens[i] for j in kept},
            )
            for i, (text, tokens) in enumerate(prompts.chats)
        ),
        heldout=HELD_OUT,
        heldout_tokens=prompts.heldout,
        perplexity={j.key: j.perplexity for j in kept},
        tokens_per_second={j.key: j.tokens_per_second for j in kept},
        reference=ref.key,
        threads=options.threads or 0,
    )
    _write(out, reference, kept, golden, options)
    return TextResult(out, ref.key, tuple(judgements), time.perf_counter() - started)


def _same_model(files: Sequence[GgufFacts]) -> None:
    """Variants are quantizations of one model: one architecture and vocabulary, no twin."""
    first = files[0]
    for other in files[1:]:
        if (other.architecture, other.vocabulary) != (first.architecture, first.vocabulary):
            raise PackagingError(
                f"{other.path.name} is a {other.architecture} model of {other.vocabulary} tokens, "
                f"{first.path.name} a {first.architecture} of {first.vocabulary}: variants must "
                "be one model's quantizations"
            )
    precisions = [f.precision for f in files]
    twin = next((p for p in precisions if precisions.count(p) > 1), None)
    if twin:
        raise PackagingError(f"two files are {twin}: one file per quantization")
    names = [f.path.name for f in files]
    same = next((n for n in names if names.count(n) > 1), None)
    if same:
        raise PackagingError(f"two files are named {same}: the package holds them side by side")


@dataclass(frozen=True)
class Prompts:
    chats: tuple[tuple[str, tuple[int, ...]], ...]  # rendered text, token ids
    heldout: tuple[int, ...]


def _render(reference: GgufFacts, session: GenerativeSession) -> Prompts:
    """The golden chats in the model's own chat template, and every text's token ids.

    Rendered and tokenized by the language plane's own code, so the recorded prompt is the
    one the agent feeds the model for the same chat; a file without a template gets the
    user's words as they are.
    """
    from edgeagent.engine.language.chat import render_chat
    from edgeagent.engine.text_requests import ChatMessage

    chats = []
    for chat in GOLDEN_CHATS:
        if reference.chat_template:
            messages = [ChatMessage(m["role"], m["content"]) for m in chat]
            text = render_chat(
                reference.chat_template, messages, bos=reference.bos, eos=reference.eos
            )
        else:
            text = "\n".join(m["content"] for m in chat) + "\n"
        chats.append((text, tuple(session.tokenize(text, add_special=True))))
    # a small vocabulary takes more tokens for the same text: keep within the judging context
    limit = min(JUDGE_CONTEXT, reference.context) - 1
    heldout = tuple(session.tokenize(HELD_OUT, add_special=True))[:limit]
    return Prompts(tuple(chats), heldout)


def _gguf(facts: GgufFacts) -> Judgement:
    return Judgement(f"{RUNTIME}/{facts.precision}", (facts.path,), facts.precision)


def _openvino(
    files: Sequence[GgufFacts],
    work: Path,
    prompts: Prompts,
    options: TextOptions,
    progress: Progress,
) -> list[Judgement]:
    """Each GGUF as OpenVINO GenAI converts it (its IR saved), judged like a GGUF variant."""
    try:
        from edgeagent.runtimes.openvino_genai import ir_from_gguf
    except RuntimeUnavailable as exc:
        raise PackagingError(f"--openvino: {exc}") from exc
    judgements = []
    for facts in files:
        folder = f"openvino-{facts.precision}"
        judged = Judgement(f"{OPENVINO}/{facts.precision}", (), facts.precision, folder)
        progress(f"{judged.key}: converting {facts.path.name} to OpenVINO IR")
        try:
            judged.files = tuple(ir_from_gguf(facts.path, work / folder))
        except RuntimeLoadError as exc:
            judged.kept, judged.why = False, f"not converted: {exc}"
            judgements.append(judged)
            continue
        with _session(OPENVINO, judged.files, options.threads) as session:
            judgements.append(_judge(judged, session, prompts, options, progress))
    return judgements


class _session:
    """A small session of one variant on the CPU (context manager: closed on the way out)."""

    def __init__(self, runtime: str, files: tuple[Path, ...], threads: int | None) -> None:
        self.runtime = runtime
        self.request = GenerativeLoadRequest(
            files=files, context=JUDGE_CONTEXT, sequences=1, batch_tokens=256, threads=threads
        )

    def __enter__(self) -> GenerativeSession:
        from edgeagent.runtimes import get_runtime

        extra = "llm" if self.runtime == RUNTIME else "llm-openvino"
        try:
            runtime: Any = get_runtime(self.runtime)  # a GenerativeRuntime, not a tensor one
            self.session: GenerativeSession = runtime.load(self.request)
        except RuntimeUnavailable as exc:
            raise PackagingError(
                f"{self.runtime} is not usable here ({exc}): pip install 'edgeagent[{extra}]'"
            ) from exc
        except RuntimeLoadError as exc:
            raise PackagingError(
                f"{self.request.files[0]}: {self.runtime} refused it: {exc}"
            ) from exc
        return self.session

    def __exit__(self, *_: object) -> None:
        self.session.close()


def _judge(
    judged: Judgement,
    session: GenerativeSession,
    prompts: Prompts,
    options: TextOptions,
    progress: Progress,
) -> Judgement:
    """``judged``'s figures: greedy answers to the golden chats, held-out perplexity."""
    progress(f"{judged.key}: golden chats and held-out perplexity ({judged.files[0].name})")
    answers = answer_all(session, [tokens for _, tokens in prompts.chats], options.max_tokens)
    judged.tokens = list(answers.tokens)
    judged.tokens_per_second = answers.tokens_per_second
    judged.perplexity = perplexity(session, prompts.heldout)
    return judged


def _compare(judged: Judgement, ref: Judgement, rules: TextRules) -> None:
    judged.agreement = sum(
        agreement(r, v) for r, v in zip(ref.tokens, judged.tokens, strict=True)
    ) / len(ref.tokens)
    judged.perplexity_ratio = judged.perplexity / ref.perplexity
    problems = []
    if judged.agreement < rules.min_agreement:
        problems.append(f"agreement {judged.agreement:.3f} < --min-agreement {rules.min_agreement}")
    if judged.perplexity_ratio > rules.max_perplexity_ratio:
        problems.append(
            f"perplexity ratio {judged.perplexity_ratio:.3f} > --max-perplexity-ratio "
            f"{rules.max_perplexity_ratio}"
        )
    judged.kept = not problems
    judged.why = "; ".join(problems)


def _figures(judged: Judgement, reference: str) -> str:
    verdict = (
        "reference"
        if judged.key == reference
        else ("kept" if judged.kept else f"DROPPED: {judged.why}")
    )
    return (
        f"{judged.key}: agreement {judged.agreement:.3f}, perplexity {judged.perplexity:.3f} "
        f"(× {judged.perplexity_ratio:.3f} the reference's), {judged.tokens_per_second:.1f} "
        f"tokens/s — {verdict}"
    )


def _write(
    out: Path,
    reference: GgufFacts,
    kept: Sequence[Judgement],
    golden: TextGolden,
    options: TextOptions,
) -> None:
    """Stage the package beside ``out``, check it loads as the agent loads it, move it in."""
    out.parent.mkdir(parents=True, exist_ok=True)
    name = options.name or reference.path.stem.split(".")[0].lower()
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp)
        names = {}  # variant key → its files' names in the package
        for judged in kept:
            (staging / judged.folder).mkdir(exist_ok=True)
            names[judged.key] = [f"{judged.folder}/{f.name}".lstrip("/") for f in judged.files]
            for file, stored in zip(judged.files, names[judged.key], strict=True):
                shutil.copyfile(file, staging / stored)
        (staging / GOLDEN_FILE).write_text(json.dumps(golden.to_json()) + "\n", encoding="utf-8")
        text = {
            "architecture": reference.architecture,
            "context": reference.context,
            "chat_template": reference.chat_template is not None,
            "bos": reference.bos,
            "eos": reference.eos,
            "stop": [reference.eos] if reference.eos else None,
        }
        table = {
            "name": name,
            "version": options.version,
            "task": "text-generation",
            "description": options.description or reference.title or None,
            "golden": GOLDEN_FILE,
            "device_files": [GOLDEN_FILE],
            "text": text,
            "variant": [
                {
                    "runtime": j.key.split("/")[0],
                    "precision": j.precision,
                    "files": names[j.key],
                    "sha256": {Path(n).name: file_sha256(staging / n) for n in names[j.key]},
                }
                for j in kept
            ],
        }
        write_table(staging, table)
        try:
            load_package(staging)  # the result must load exactly as the agent will load it
        except PackageError as exc:
            raise PackagingError(f"the package written does not load: {exc}") from exc
        staging.chmod(0o755)  # a temporary directory is private; a package is not
        if out.exists():
            out.rmdir()  # empty (checked above): the staged package takes its place
        staging.rename(out)
        staging.mkdir()  # for TemporaryDirectory's clean-up
