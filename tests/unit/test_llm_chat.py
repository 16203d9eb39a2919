"""Chats rendered with the model's own template (engine/language/chat.py): the GGUF's Jinja2
source as transformers renders it, in a sandbox, its refusals and bad roles a 400."""

from __future__ import annotations

import pytest

from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.language.chat import TemplateError, render_chat
from edgeagent.engine.text_requests import ChatMessage
from tests.support.language import smollm2_gguf

MESSAGES = (ChatMessage("system", "Be brief."), ChatMessage("user", "Hi!"))


@pytest.fixture(scope="module")
def template() -> str:
    gguf = pytest.importorskip("gguf")
    return str(gguf.GGUFReader(smollm2_gguf()).fields["tokenizer.chat_template"].contents())


def test_the_files_template_renders_chatml_with_the_generation_prompt(template: str) -> None:
    prompt = render_chat(template, MESSAGES, bos="<|im_start|>", eos="<|im_end|>")
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # without a system message the template adds its own default one
    alone = render_chat(template, MESSAGES[1:], bos="", eos="")
    assert alone.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_an_unknown_role_or_no_message_is_refused(template: str) -> None:
    with pytest.raises(InvalidInput, match=r"messages\[1\].role: 'robot' is not one of system"):
        render_chat(template, (MESSAGES[0], ChatMessage("robot", "x")), bos="", eos="")
    with pytest.raises(InvalidInput, match="at least one message"):
        render_chat(template, (), bos="", eos="")


def test_a_model_without_a_template_asks_for_a_plain_prompt() -> None:
    with pytest.raises(InvalidInput, match="no chat template: send a plain prompt"):
        render_chat(None, MESSAGES, bos="", eos="")


def test_the_templates_own_refusal_is_a_400() -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(TemplateError, match="refused the messages: user first") as refused:
        render_chat(strict, MESSAGES, bos="", eos="")
    assert refused.value.status == 400


def test_a_hostile_template_cannot_reach_python() -> None:
    escape = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateError, match="chat template failed"):
        render_chat(escape, MESSAGES, bos="", eos="")
    mutate = "{% set _ = messages.append(1) %}{{ messages | length }}"
    with pytest.raises(TemplateError):
        render_chat(mutate, MESSAGES, bos="", eos="")
