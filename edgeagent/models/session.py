"""Open one variant of a package on one device: the manual path (CLI flags, benchmarks).

The daemon's automatic choice lives in edgeagent.hardware; this is for a person who names the
runtime or precision, and for tools that must measure one variant in isolation.
"""

from __future__ import annotations

from pathlib import Path

from edgeagent.models.package import ModelPackage, Variant
from edgeagent.models.unsealer import SealedError, Unsealer
from edgeagent.runtimes import (
    LoadRequest,
    RuntimeLoadError,
    RuntimeUnavailable,
    Session,
    get_runtime,
)

# Without any preference: quantized first (the point of the zoo), the base runtime first.
DEFAULT_ORDER = (
    ("onnxruntime", "int8"),
    ("litert", "int8"),
    ("openvino", "int8"),
    ("onnxruntime", "fp32"),
    ("openvino", "fp32"),
    ("litert", "fp32"),
)


class VariantChoiceError(LookupError):
    """No variant of the package matches the request or loads here; says what was tried."""


def load_request(
    package: ModelPackage,
    variant: Variant,
    device: str = "CPU",
    threads: int | None = None,
    cache_dir: Path | None = None,
    options: dict | None = None,
    unsealer: Unsealer | None = None,
) -> LoadRequest:
    """The LoadRequest for a variant, carrying the package's logical tensor names.

    The session transposes only when the file's layout differs from what clients send: an
    NHWC file in a package whose logical input is NHWC too takes the requests as they are.
    A sealed variant is decrypted here with ``unsealer`` into the request's ``contents``, and
    gets no ``cache_dir``: a compiled-model cache would put the model on disk after all.
    """
    transpose = variant.layout if variant.layout not in (None, package.input_layout) else None
    contents = None
    if variant.sealed_files:
        if unsealer is None:
            raise SealedError(
                f"{package.name} {package.version} {variant.key} is sealed: only an agent "
                "holding the device key it was encrypted for can open it"
            )
        contents, cache_dir = unsealer.contents(package, variant), None
    return LoadRequest(
        files=variant.files,
        device=device,
        precision=variant.precision,
        options=options or {},
        threads=threads,
        cache_dir=cache_dir,
        layout=transpose,
        input_names=tuple(t.name for t in package.inputs),
        output_names=tuple(t.name for t in package.outputs),
        contents=contents,
    )


def matching_variants(
    package: ModelPackage, runtime: str | None, precision: str | None
) -> list[Variant]:
    """The package's variants that fit the flags, in DEFAULT_ORDER."""
    rank = {key: i for i, key in enumerate(DEFAULT_ORDER)}
    chosen = [
        v
        for v in package.variants
        if (runtime is None or v.runtime == runtime)
        and (precision is None or v.precision == precision)
    ]
    return sorted(chosen, key=lambda v: rank.get((v.runtime, v.precision), len(rank)))


def open_variant(
    package: ModelPackage,
    runtime: str | None = None,
    precision: str | None = None,
    device: str | None = None,
    threads: int | None = None,
    unsealer: Unsealer | None = None,
) -> Session:
    """Load the first matching variant that works here; VariantChoiceError lists every failure."""
    candidates = matching_variants(package, runtime, precision)
    if not candidates:
        have = ", ".join(v.key for v in package.variants)
        raise VariantChoiceError(
            f"{package.name} has no variant for runtime={runtime or 'any'} "
            f"precision={precision or 'any'} (it has: {have})"
        )
    failures = []
    for variant in candidates:
        try:
            plugin = get_runtime(variant.runtime)
            request = load_request(package, variant, device or "CPU", threads, unsealer=unsealer)
            return plugin.load(request)
        except (RuntimeLoadError, RuntimeUnavailable, SealedError) as exc:
            failures.append(f"{variant.key}: {exc}")
    raise VariantChoiceError(f"no variant of {package.name} loads here: " + "; ".join(failures))
