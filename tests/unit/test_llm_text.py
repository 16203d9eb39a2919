"""Text assembly (engine/language/text.py): whole characters only, stop strings held back
across token boundaries and never sent."""

from __future__ import annotations

from edgeagent.engine.language.text import TextAssembler


def _run(pieces: list[bytes], stop: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    text = TextAssembler(stop)
    out = [text.feed(piece) for piece in pieces]
    if not text.stopped:
        out.append(text.finish())
    return out, text.stopped


def test_a_character_split_over_tokens_comes_out_whole() -> None:
    rocket = "🚀".encode()
    out, _ = _run([b"go ", rocket[:2], rocket[2:3], rocket[3:] + b"!"])
    assert out == ["go ", "", "", "🚀!", ""]
    assert all("\ufffd" not in chunk for chunk in out)


def test_an_unfinished_character_at_the_end_is_a_replacement_character() -> None:
    out, _ = _run([b"ok", "é".encode()[:1]])
    assert "".join(out) == "ok\ufffd"


def test_a_stop_string_split_over_tokens_ends_the_text_before_it() -> None:
    out, stopped = _run([b"Hello", b" wor", b"ld<|", b"end", b"|> more"], stop=("<|end|>",))
    assert stopped
    assert "".join(out) == "Hello world"
    assert out == ["Hello", " wor", "ld", "", ""]  # "<|" held back, the text before it sent


def test_text_that_only_looked_like_a_stop_string_is_released() -> None:
    out, stopped = _run([b"a <", b"b> c"], stop=("<|end|>",))
    assert not stopped
    assert out == ["a ", "<b> c", ""]


def test_the_earliest_of_several_stop_strings_wins() -> None:
    out, stopped = _run([b"one. two\n\nthree"], stop=("\n\n", "two"))
    assert stopped and "".join(out) == "one. "


def test_held_text_is_sent_at_the_end_when_no_stop_came() -> None:
    out, stopped = _run([b"ends with STO"], stop=("STOP",))
    assert not stopped and out == ["ends with ", "STO"]
