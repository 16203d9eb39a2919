"""Property tests for every parser that sees untrusted update bytes (issue 10, "keep it
attacked"): the envelope, the manifest, the trust file / chain and the unpacker.

The property is the same everywhere: hostile input either parses into something that obeys
the documented invariants, or is refused with the parser's own error and a stable code —
never another exception (RecursionError, ValueError from int(), UnicodeError …) and never a
change on disk.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgeagent.fleet.agent_manifest import parse_agent_manifest
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import OPENING_FIELDS, ManifestError, parse_manifest
from edgeagent.fleet.signing import (
    TrustError,
    VerificationError,
    decode_envelope,
    json_depth,
    loads_strict,
)
from edgeagent.fleet.trust import TrustStore, parse_trust
from edgeagent.models.package import NAME_RE, VERSION_RE
from edgeagent.updates.unpack import UnpackError, unpack_archive
from tests.unit.test_trust_sim import NOW, Simulator, dumps

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _mutations(document: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """A valid document with one field replaced by arbitrary JSON (or removed)."""
    keys = sorted(document)

    def mutate(key: str, value: Any, remove: bool) -> bytes:
        changed = dict(document)
        if remove:
            changed.pop(key)
        else:
            changed[key] = value
        return dumps(changed)

    return st.builds(mutate, st.sampled_from(keys), json_values, st.booleans())


@EXAMPLES
@given(st.binary(max_size=512) | st.builds(lambda v: json.dumps(v).encode(), json_values))
def test_decode_envelope_refuses_or_returns_an_envelope(data: bytes) -> None:
    try:
        envelope = decode_envelope(data, max_bytes=MAX_ENVELOPE_BYTES)
    except VerificationError as exc:
        assert exc.code in {"malformed", "too_large"}
    else:
        assert envelope.signatures and all(len(s.keyid) == 64 for s in envelope.signatures)


@EXAMPLES
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", '{"a":']))
def test_deep_nesting_is_malformed_never_a_recursion_error(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    text = opener * depth + "1" + closer * depth
    try:
        loads_strict(text.encode(), "doc")
    except VerificationError as exc:
        assert exc.code == "malformed" and json_depth(text) > 32
    else:
        assert json_depth(text) <= 32


@EXAMPLES
@given(st.data())
def test_parse_manifest_invariants(data: st.DataObject) -> None:
    valid = Simulator().release_doc()
    payload = data.draw(_mutations(valid) | st.binary(max_size=256))
    try:
        manifest = parse_manifest(payload)
    except ManifestError as exc:
        assert exc.code in ("malformed", "unsupported_format")
        return
    assert NAME_RE.match(manifest.model) and VERSION_RE.match(manifest.version)
    assert len(manifest.version) <= 29 and manifest.artifact.size >= 1
    assert manifest.expires > manifest.issued_at
    assert parse_manifest(manifest.to_payload()) == manifest


@EXAMPLES
@given(st.data())
def test_parse_trust_invariants(data: st.DataObject) -> None:
    sim = Simulator()
    payload = data.draw(_mutations(sim.trust_doc()) | st.binary(max_size=256))
    try:
        root = parse_trust(payload)
    except VerificationError as exc:
        assert exc.code == "malformed"
        return
    for role in root.roles.values():
        assert 1 <= role.threshold <= len(role.keyids) and role.keyids <= set(root.keys)


_SIM = Simulator()


@settings(max_examples=60, deadline=None)
@given(
    st.binary(max_size=512)
    | st.builds(lambda v: json.dumps(v).encode(), json_values)
    | st.builds(lambda items: json.dumps(items).encode(), st.lists(json_values, max_size=5))
)
def test_a_hostile_trust_message_changes_nothing(message: bytes) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = _SIM.write_trust(Path(scratch) / "trust.json", _SIM.trust_doc())
        before = path.read_bytes()
        store = TrustStore.load(path)
        try:
            store.update(message, now=NOW)
        except TrustError as exc:
            assert exc.code
        assert path.read_bytes() == before and store.version == 1


names = st.lists(
    st.sampled_from(["m", "..", ".", "", "model.toml", "a b", "x\\y", "/", "é"]),
    min_size=1,
    max_size=4,
).map("/".join)
kinds = st.sampled_from(
    [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE]
)
entries = st.lists(
    st.tuples(names, kinds, st.binary(max_size=64), st.sampled_from(["", "model.toml", "/x"])),
    max_size=8,
)


def _archive(items: list[tuple[str, bytes, bytes, str]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, body, link in items:
            info = tarfile.TarInfo(name or ".")
            info.type = kind
            info.linkname = link
            info.size = len(body) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(body) if kind == tarfile.REGTYPE else None)
    return buffer.getvalue()


@settings(max_examples=120, deadline=None)
@given(entries | st.binary(max_size=300).map(lambda b: [("raw", b"", b, "")]))
def test_the_unpacker_writes_only_inside_its_destination(items) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        archive = root / "a.tar.gz"
        if items and items[0][0] == "raw":
            archive.write_bytes(items[0][2])
        else:
            archive.write_bytes(_archive(items))
        dest = root / "box" / "out"
        try:
            package = unpack_archive(archive, dest, max_bytes=4096, max_files=6)
        except UnpackError:
            assert not dest.exists()
        else:
            assert package == dest or package.parent == dest
            for path in dest.rglob("*"):
                assert not path.is_symlink() and (path.is_file() or path.is_dir())
                assert path.resolve().is_relative_to(dest.resolve())
        outside = {p.name for p in root.iterdir()}
        assert outside <= {"a.tar.gz", "box"}
        assert {p.name for p in (root / "box").iterdir()} <= {"out"}


def _agent_doc(release: dict[str, Any]) -> dict[str, Any]:
    """A valid agent release with ``release``'s opening (serial, validity, rollout, targets)."""
    opening = {k: release[k] for k in OPENING_FIELDS - {"type", "format"}}
    wheelhouse = {"platform": "linux_x86_64", **release["artifact"]}
    body = {"version": "1.2.3", "python": "3.11", "wheelhouses": [wheelhouse]}
    return {"type": "agent_release", "format": 2, **opening, **body}


_OPENING_PATHS = sorted(OPENING_FIELDS - {"type", "format"}) + [
    f"targets.{name}" for name in ("profiles", "device_classes", "device_ids", "regions")
]
_opening_values = json_values | st.sampled_from(
    [0, 1, 2**53 - 1, 2**53, "dep-1\n", "a/+/#", ["dev-1"], ["dev-1\n"], ["x"] * 1025]
)


@EXAMPLES
@given(st.sampled_from(_OPENING_PATHS), _opening_values, st.booleans())
def test_both_manifests_refuse_a_bad_opening_in_the_same_words(
    path: str, value: Any, remove: bool
) -> None:
    """The opening is read by one function: a fault in it is refused by a model and an agent
    manifest alike, in the same words after the document's name."""
    release = Simulator().release_doc()
    outcomes = []
    for what, document, parse in (
        ("manifest", release, parse_manifest),
        ("agent manifest", _agent_doc(release), parse_agent_manifest),
    ):
        *parents, last = path.split(".")
        target = document
        for key in parents:
            target = target[key]
        if remove:
            target.pop(last, None)
        else:
            target[last] = value
        try:
            parse(dumps(document))
        except ManifestError as exc:
            assert exc.message.startswith(what + " ") or exc.message.startswith(what + ":")
            outcomes.append((exc.code, exc.message[len(what) :]))
        else:
            outcomes.append(("accepted", ""))
    assert outcomes[0] == outcomes[1]
