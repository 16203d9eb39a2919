"""A chat rendered into a prompt by the model's own template, as its trainers wrote it.

The template is the Jinja2 source in the model file (GGUF ``tokenizer.chat_template``), run in
Jinja2's immutable sandbox the way transformers' ``apply_chat_template`` and llama.cpp's
minja do: ``trim_blocks``/``lstrip_blocks``, ``raise_exception`` for the template's own
refusals (a role order it does not accept), ``strftime_now``, and the BOS/EOS strings. A
template is untrusted input (it came with a downloaded file): the sandbox keeps it from
reaching Python attributes, and its errors become the request's 400.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.text_requests import ROLES, ChatMessage


class TemplateError(InvalidInput):
    """The chat cannot be rendered: an unknown role, or the template refused it."""


def _raise(message: str) -> NoReturn:
    raise TemplateError(f"the model's chat template refused the messages: {message}")


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False
    )
    environment.globals["raise_exception"] = _raise
    environment.globals["strftime_now"] = lambda fmt: time.strftime(fmt)
    return environment.from_string(source)


def check_roles(messages: Sequence[ChatMessage]) -> None:
    if not messages:
        raise InvalidInput("messages: at least one message is required")
    for index, message in enumerate(messages):
        if message.role not in ROLES:
            raise InvalidInput(
                f"messages[{index}].role: {message.role!r} is not one of {', '.join(ROLES)}"
            )


def render_chat(
    template: str | None, messages: Sequence[ChatMessage], *, bos: str, eos: str
) -> str:
    """The prompt for ``messages``, ending where the assistant's answer begins."""
    check_roles(messages)
    if not template:
        raise InvalidInput("the model carries no chat template: send a plain prompt instead")
    from jinja2 import TemplateError as JinjaError

    try:
        return str(
            _compile(template).render(
                messages=[{"role": m.role, "content": m.content} for m in messages],
                add_generation_prompt=True,
                bos_token=bos,
                eos_token=eos,
            )
        )
    except JinjaError as exc:
        raise TemplateError(f"the model's chat template failed: {exc}") from exc
