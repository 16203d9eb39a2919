"""``hub sign --agent``: wheelhouses of the agent into a signed agent release.

A wheelhouse is a directory of wheels — the agent's and every dependency it needs on one
platform, e.g. ``pip wheel . -w wh/`` on (or cross-built for) that platform — packed into one
reproducible tarball. The release (``fleet.agent_manifest``) names one tarball per platform,
the Python version they were built for and the next serial of the ``edgeagent`` counter, and is
signed by the *agent* key(s): the trust file's ``agent`` role, which the model release key is
not part of. With a trust file the envelope is verified as devices will before anything but
the serial counter is written.

Nothing is signed that a device could not install: every wheel must carry a tag for the
platform and Python it is signed for (a ``pip wheel`` run on an x86_64 box gives x86_64
wheels, whatever ``--platform`` says), and the agent's code must say the version its wheel is
(``__version__``), or the new agent could never confirm its switch.
"""

from __future__ import annotations

import ast
import hashlib
import re
import secrets
import zipfile
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from edgeagent.fleet.agent_manifest import (
    AgentManifest,
    Wheelhouse,
    parse_agent_manifest,
    this_python,
)
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import Artifact, ManifestError, Targets
from edgeagent.fleet.signing import TrustError, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.fsutil import write_file_atomic
from edgeagent.hub.deltas import DEFAULT_MAX_RATIO, build_deltas, old_agent_release
from edgeagent.hub.keys import HubError, load_private_key
from edgeagent.hub.serials import ReleaseSerials, serials_path_for
from edgeagent.hub.sign import DEFAULT_RELEASE_LIFETIME, _tar

SERIAL_NAME = "edgeagent"  # the agent's serial counter (beside the models')
_AGENT_WHEEL_RE = re.compile(r"\Aedgeagent-([0-9]+(?:\.[0-9]+){0,2})-.*\.whl\Z")


def agent_version_of(directory: Path) -> str:
    """The version of the single agent wheel in ``directory``."""
    found = {m.group(1) for p in directory.glob("*.whl") if (m := _AGENT_WHEEL_RE.match(p.name))}
    if len(found) != 1:
        raise HubError(
            f"{directory}: needs exactly one edgeagent-<version>-*.whl, found "
            f"{sorted(found) or 'none'} (build it with 'pip wheel . -w {directory}')"
        )
    return found.pop()


def _python_fits(tag: Tag, python: str) -> bool:
    """Whether ``tag``'s interpreter and ABI run on CPython ``python`` (``3.11``)."""
    minor = int(python.split(".")[1])
    found = re.fullmatch(r"(py|cp)3([0-9]*)", tag.interpreter)
    if found is None:
        return False
    kind, built_for = found.group(1), int(found.group(2) or 0)
    if kind == "py" or tag.abi == "abi3":
        return built_for <= minor  # pure Python, or the stable ABI of that version and later
    return built_for == minor  # an extension module for exactly one CPython


def _platform_fits(tag: Tag, platform_tag: str) -> bool:
    """Whether ``tag``'s platform runs on ``platform_tag`` (``linux_aarch64``)."""
    if tag.platform == "any":
        return True
    system, _, machine = platform_tag.partition("_")
    families = ("linux_", "manylinux", "musllinux_") if system == "linux" else (f"{system}_",)
    return tag.platform.startswith(families) and tag.platform.endswith(f"_{machine}")


def check_wheels(directory: Path, platform_tag: str, python: str) -> None:
    """Refuse (HubError naming them) the wheels of ``directory`` that pip would not install on
    ``platform_tag`` under CPython ``python``: no tag of theirs fits both."""
    unfit = []
    for path in sorted(directory.glob("*.whl")):
        try:
            tags = parse_wheel_filename(path.name)[3]
        except InvalidWheelFilename as exc:
            raise HubError(f"{path}: not a wheel's name ({exc})") from exc
        if not any(_python_fits(t, python) and _platform_fits(t, platform_tag) for t in tags):
            unfit.append(path.name)
    if unfit:
        shown = ", ".join(unfit[:5]) + (f" and {len(unfit) - 5} more" if len(unfit) > 5 else "")
        raise HubError(
            f"{directory}: {shown} cannot install on {platform_tag} with Python {python}: "
            "build the wheelhouse on (or for) that platform and Python, or sign it as the one "
            "it is for (--platform, --python)"
        )


def code_version(directory: Path, version: str) -> str | None:
    """The ``__version__`` that ``edgeagent/__init__.py`` sets in the agent wheel of
    ``version`` in ``directory`` (None: it sets none)."""
    wheel = next(directory.glob(f"edgeagent-{version}-*.whl"))
    try:
        with zipfile.ZipFile(wheel) as archive:
            tree = ast.parse(archive.read("edgeagent/__init__.py"))
    except (zipfile.BadZipFile, KeyError, SyntaxError, ValueError, OSError) as exc:
        raise HubError(f"{wheel}: cannot read edgeagent/__init__.py ({exc})") from exc
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["__version__"]
            and isinstance(node.value, ast.Constant)
        ):
            return str(node.value.value)
    return None


def wheelhouse_tar(directory: Path) -> bytes:
    """Every ``*.whl`` of ``directory`` in a reproducible tar.gz (nothing else goes in)."""
    wheels = sorted(directory.glob("*.whl"))
    if any(p.is_symlink() or not p.is_file() for p in wheels):
        raise HubError(f"{directory}: wheels must be regular files")
    return _tar({p.name: p.read_bytes() for p in wheels})


def sign_agent_release(
    wheelhouses: Mapping[str, Path],
    *,
    key_paths: Sequence[str | Path],
    base_url: str,
    out_dir: Path,
    python: str | None = None,
    targets: Targets | None = None,
    expires_in: timedelta = DEFAULT_RELEASE_LIFETIME,
    deployment_id: str | None = None,
    serials: ReleaseSerials | None = None,
    trust_path: Path | None = None,
    passphrase: bytes | None = None,
    now: datetime | None = None,
    delta_from: Path | None = None,
    delta_max_ratio: float = DEFAULT_MAX_RATIO,
) -> Path:
    """Write one tarball per platform and ``edgeagent-<version>.agent-release.json``; return
    the envelope's path. ``wheelhouses`` maps platform tags (``linux_aarch64``) to wheel
    directories, all holding the same agent version. With ``delta_from`` (an earlier
    ``.agent-release.json`` whose wheelhouses are in ``out_dir``) each wheelhouse also names a
    patch from that release's (``hub.deltas``): a device ships only the wheels it lacks, the
    unchanged ones are copied from the wheelhouse it installed last."""
    if not wheelhouses:
        raise HubError("an agent release needs at least one wheelhouse")
    keys = [load_private_key(p, passphrase) for p in key_paths]
    if not keys:
        raise HubError("signing an agent release needs the agent key(s) (--key)")
    versions = {agent_version_of(Path(d)) for d in wheelhouses.values()}
    if len(versions) != 1:
        raise HubError(f"the wheelhouses hold different agent versions: {sorted(versions)}")
    version = versions.pop()
    python = python or this_python()
    for tag, directory in sorted(wheelhouses.items()):
        said = code_version(Path(directory), version)
        if said != version:
            raise HubError(
                f"{directory}: the wheel is edgeagent {version} but its code says "
                f"__version__ = {said!r}: devices would switch to it and never confirm it; "
                "build it again (the version lives in edgeagent/__init__.py only)"
            )
        check_wheels(Path(directory), tag, python)
    data = {tag: wheelhouse_tar(Path(d)) for tag, d in sorted(wheelhouses.items())}
    names = {tag: f"edgeagent-{version}-{tag}.wheelhouse.tar.gz" for tag in data}
    base = base_url.rstrip("/")
    deltas = {}
    if delta_from is not None:
        old = old_agent_release(delta_from)
        deltas = build_deltas(old, out_dir, data, names, base, delta_max_ratio)
    counter = serials or ReleaseSerials(serials_path_for(key_paths[0]))
    issued = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    manifest = AgentManifest(
        version=version,
        serial=counter.next(SERIAL_NAME),
        python=python,
        wheelhouses=tuple(
            Wheelhouse(
                tag,
                Artifact(
                    f"{base}/{names[tag]}",
                    len(blob),
                    hashlib.sha256(blob).hexdigest(),
                    deltas[tag].delta if tag in deltas else None,
                ),
            )
            for tag, blob in data.items()
        ),
        issued_at=issued,
        expires=issued + expires_in,
        deployment_id=deployment_id or f"agent-{version}-{secrets.token_hex(4)}",
        targets=targets or Targets(),
    )
    payload = manifest.to_payload()
    try:
        parse_agent_manifest(payload)
    except ManifestError as exc:
        raise HubError(f"cannot sign this agent release: {exc.message}") from exc
    envelope = sign_envelope(payload, keys)
    if len(envelope) > MAX_ENVELOPE_BYTES:
        raise HubError(f"the signed agent release is {len(envelope)} bytes, too large")
    if trust_path is not None:
        try:
            TrustStore.load(trust_path).verify(envelope, "agent")
        except TrustError as exc:
            raise HubError(f"devices trusting {trust_path} would refuse it: {exc}") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    for tag, blob in data.items():
        write_file_atomic(out_dir / names[tag], blob)
    for patch in deltas.values():
        write_file_atomic(out_dir / patch.name, patch.data)
    path = out_dir / f"edgeagent-{version}.agent-release.json"
    write_file_atomic(path, envelope)
    return path
