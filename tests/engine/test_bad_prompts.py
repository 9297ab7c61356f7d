"""Bad prompts and concurrent use of one engine: each a clear one-line error, never another exception or a silent
wrong answer."""

from __future__ import annotations

import threading

import pytest

from edge import Engine
from edge.errors import EngineBusyError, PromptError


@pytest.fixture(scope="module")
def engine(llama_dir) -> Engine:
    return Engine.load(llama_dir, max_context=128)


@pytest.mark.parametrize("prompt", [b"Once upon", bytearray(b"Once"), None, 3, [1.5, 2.0], ["a", "b"]])
def test_a_prompt_is_text_or_token_ids(engine, prompt):
    with pytest.raises(PromptError, match="a prompt is text") as error:
        engine.complete(prompt, max_new_tokens=4, temperature=0.0)
    assert "\n" not in str(error.value)


def test_undecodable_text_is_a_prompt_error(engine):
    undecodable = b"Once \xff upon".decode("utf-8", "surrogateescape")  # how Python reads such argv or stdin
    for call in (lambda: engine.complete(undecodable, max_new_tokens=4, temperature=0.0),
                 lambda: engine.complete("lone \ud800 surrogate", max_new_tokens=4, temperature=0.0),
                 lambda: "".join(e.text for e in engine.chat([{"role": "user", "content": undecodable}])),
                 lambda: engine.fit_chat([{"role": "user", "content": undecodable}], reserve=8)):
        with pytest.raises(PromptError, match="not valid UTF-8 .* character"):
            call()


def test_token_ids_of_any_integer_type_still_work(engine):
    import numpy as np
    import torch

    ids = engine.tokenizer.encode("Once upon a time", add_special_tokens=True)
    expected = engine.complete(ids, max_new_tokens=6, ignore_eos=True, temperature=0.0)
    assert engine.complete(np.array(ids), max_new_tokens=6, ignore_eos=True, temperature=0.0) == expected
    assert engine.complete(torch.tensor(ids), max_new_tokens=6, ignore_eos=True, temperature=0.0) == expected


def test_one_engine_runs_one_generation_at_a_time(engine):
    first = engine.generate("Once upon a time", max_new_tokens=8, ignore_eos=True, temperature=0.0)
    next(first)
    second = engine.generate("The quick brown fox", max_new_tokens=8, ignore_eos=True, temperature=0.0)
    with pytest.raises(EngineBusyError, match="already generating"):
        next(second)
    rest = "".join(event.text for event in first)  # the first goes on undisturbed
    assert rest is not None
    first.close()
    assert engine.complete("Once upon a time", max_new_tokens=8, ignore_eos=True, temperature=0.0)  # free again

    errors, started, release = [], threading.Event(), threading.Event()

    def hold():
        for _ in engine.generate("Once upon a time", max_new_tokens=64, ignore_eos=True, temperature=0.0):
            started.set()
            release.wait(5)

    holder = threading.Thread(target=hold)
    holder.start()
    started.wait(5)
    try:
        engine.complete("The quick brown fox", max_new_tokens=4, temperature=0.0)
    except EngineBusyError as error:
        errors.append(error)
    release.set()
    holder.join()
    assert len(errors) == 1


def test_an_abandoned_reply_frees_the_engine(engine):
    for _ in engine.generate("Once upon a time", max_new_tokens=16, ignore_eos=True, temperature=0.0):
        break
    assert engine.complete("Once upon a time", max_new_tokens=4, ignore_eos=True, temperature=0.0)


def test_an_undecodable_command_line_prompt_is_one_line(llama_dir, capsys):
    from edge.tui.cli import main

    undecodable = b"Once \xff upon".decode("utf-8", "surrogateescape")
    assert main([str(llama_dir), "--prompt", undecodable, "--max-new-tokens", "4"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("edge-chat: error: the chat is not valid UTF-8") and "\n" not in error
