"""Install one agent version from its wheelhouse into its own venv, and let it judge the config.

The wheelhouse is a tar of wheel files only (the agent's and its dependencies'); it is read
member by member — regular files named ``*.whl``, no paths, within a size cap — so nothing else
ever lands on disk. The venv is created in its final place (venvs are not relocatable: their
scripts name their interpreter), and a version counts as installed only once
``installed.json`` is written last, fsynced; ``Layout.prune`` removes anything without it.

Every venv is made with its own pip (``python -m venv``: the interpreter's bundled pip, from
``ensurepip``, no network), and that pip installs the version with ``--no-index``: the device
never asks a package index for anything, and no version needs another version's (or the
system's) pip — the next release is installed the same way by whichever version runs then.
Each child interpreter gets the environment without ``PYTHONPATH`` / ``PYTHONHOME``, so a venv
reads only what it holds. The installed code must say it is the version its wheel is
(``version_mismatch``: a version that does not know itself could never confirm its switch).
Before any link moves, the new version's own ``edgeagent config check`` must accept the live
config and its ``edgeagent agent-update check-state`` the state directory that config names, so
a new version that cannot read either is refused with the old one untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgeagent.fleet import outcomes
from edgeagent.fsutil import fsync_tree, write_json_atomic
from edgeagent.selfupdate.layout import MARKER, Layout

MAX_WHEELS = 512
_OUTPUT_TAIL = 2000  # characters of a failed command's output kept in the refusal


class InstallError(RuntimeError):
    """The new version could not be installed or refused the config; nothing was switched."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class InstallSettings:
    timeout_s: float
    max_unpacked_bytes: int
    extra_site_dirs: Sequence[Path] = ()
    python: str = sys.executable  # whose base interpreter (and bundled pip) the venv takes


def is_installed(layout: Layout, version: str) -> bool:
    return (layout.version_dir(version) / MARKER).is_file()


def unpack_wheelhouse(archive: Path, into: Path, max_bytes: int) -> list[Path]:
    """The wheels of ``archive`` in ``into``; anything but flat ``*.whl`` files is refused."""
    into.mkdir(parents=True, exist_ok=True)
    wheels: list[Path] = []
    total = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./")
                if member.isdir() and name in ("", "."):
                    continue
                if not member.isfile() or "/" in name or not name.endswith(".whl"):
                    raise InstallError(
                        outcomes.BAD_WHEELHOUSE, f"{member.name[:80]!r}: not a wheel file"
                    )
                total += member.size
                if total > max_bytes or len(wheels) >= MAX_WHEELS:
                    raise InstallError(
                        outcomes.BAD_WHEELHOUSE,
                        f"over {max_bytes} bytes or {MAX_WHEELS} wheels ([updates] "
                        "max_unpacked_bytes)",
                    )
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                with source, open(into / name, "xb") as target:
                    shutil.copyfileobj(source, target)
                wheels.append(into / name)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InstallError(outcomes.BAD_WHEELHOUSE, f"{archive.name}: {exc}") from exc
    if not wheels:
        raise InstallError(outcomes.BAD_WHEELHOUSE, f"{archive.name}: holds no wheel")
    return wheels


_NOT_INHERITED = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "NOTIFY_SOCKET")


def _child_env() -> dict[str, str]:
    """This environment, less what would make a child interpreter read outside its venv (or
    talk to the service manager as if it were the service)."""
    return {k: v for k, v in os.environ.items() if k not in _NOT_INHERITED}


def _run(command: list[str], timeout_s: float, code: str, what: str) -> str:
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=_child_env(),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise InstallError(code, f"{what}: still running after {timeout_s:.0f} s") from exc
    except OSError as exc:
        raise InstallError(code, f"{what}: {exc}") from exc
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-_OUTPUT_TAIL:]
        raise InstallError(code, f"{what} exited {done.returncode}: {output}")
    return done.stdout


def install_version(
    layout: Layout, version: str, wheelhouse: Path, settings: InstallSettings
) -> Path:
    """Install ``version`` from ``wheelhouse`` (the release's tar, or a directory of wheels
    for the first install) under ``layout``; return its venv."""
    directory = layout.version_dir(version)
    if version in (layout.current(), layout.previous()):
        raise InstallError(outcomes.IN_USE, f"{directory} is in use (current or previous)")
    shutil.rmtree(directory, ignore_errors=True)  # an unfinished or pruned-late attempt
    if wheelhouse.is_dir():
        wheels = sorted(wheelhouse.glob("*.whl")) or [wheelhouse / "none.whl"]
    else:
        wheels = unpack_wheelhouse(wheelhouse, directory / "wheels", settings.max_unpacked_bytes)
    venv = layout.venv(version)
    python = str(venv / "bin" / "python")
    _run(
        [settings.python, "-m", "venv", str(venv)],  # with pip: ensurepip's, offline
        settings.timeout_s,
        "venv_failed",
        "python -m venv (with its bundled pip: on Debian/Ubuntu apt install python3-venv)",
    )
    if settings.extra_site_dirs:
        site = _site_packages(venv)
        lines = "".join(f"{Path(d).resolve()}\n" for d in settings.extra_site_dirs)
        (site / "edgeagent-extra-sites.pth").write_text(lines, encoding="utf-8")
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--find-links",
            str(wheels[0].parent),
            f"edgeagent=={version}",
        ],
        settings.timeout_s,
        "install_failed",
        "pip install",
    )
    said = _run(
        [python, "-I", "-c", "import edgeagent; print(edgeagent.__version__)"],
        settings.timeout_s,
        "version_mismatch",
        "import edgeagent",
    ).strip()
    if said != version:
        raise InstallError(
            outcomes.VERSION_MISMATCH,
            f"the wheel of edgeagent {version} holds an agent whose __version__ is {said!r}: "
            "it would never confirm its switch (build it again from one version)",
        )
    shutil.rmtree(directory / "wheels", ignore_errors=True)
    fsync_tree(directory)
    write_json_atomic(directory / MARKER, {"version": version})
    return venv


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise InstallError(outcomes.VENV_FAILED, f"{venv}: no lib/python3*/site-packages")
    return found[0]


def _judge(
    layout: Layout, version: str, args: list[str], code: str, what: str, timeout_s: float
) -> None:
    """Run one of the new version's own checks; non-zero exit → InstallError ``code``."""
    _run([str(layout.executable(version)), *args], timeout_s, code, f"agent {version} {what}")


def check_config(layout: Layout, version: str, config_file: Path, timeout_s: float) -> None:
    """The new version's own ``config check`` on the live config (absent file: defaults)."""
    args = ["config", "check", *([str(config_file)] if config_file.exists() else [])]
    _judge(layout, version, args, "config_refused", f"config check of {config_file}", timeout_s)


def check_state(layout: Layout, version: str, config_file: Path, timeout_s: float) -> None:
    """The new version's own ``agent-update check-state`` on the state directory the live
    config names: a state format newer than it reads is refused (``state_refused``)."""
    args = ["agent-update", "check-state"]
    args += ["--config", str(config_file)] if config_file.exists() else []
    _judge(layout, version, args, "state_refused", "check-state", timeout_s)
