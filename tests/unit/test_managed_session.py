"""``is_managed``: the engine's per-request question "does this session manage backends?",
answered as the ``ManagedSession`` protocol would, without its per-call cost."""

from __future__ import annotations

from typing import Any

from edgeagent.hardware.fallback import ResilientSession
from edgeagent.hardware.instances import InstanceGroup
from edgeagent.runtimes.base import ManagedSession, is_managed
from edgeagent.runtimes.remote import RemoteSession


class _Plain:
    def status(self) -> dict[str, Any]:
        return {}


class _Managed(_Plain):
    @property
    def candidate(self) -> None:
        return None

    def set_power_mode(self, mode: str) -> None:
        del mode


def test_it_answers_as_the_protocol_does() -> None:
    for session in (_Plain(), _Managed(), object()):
        assert is_managed(session) == isinstance(session, ManagedSession)
    assert is_managed(_Managed()) and not is_managed(_Plain())


def test_the_engines_managing_sessions_are_managed() -> None:
    for kind in (ResilientSession, RemoteSession, InstanceGroup):
        assert is_managed(kind.__new__(kind)), kind.__name__
