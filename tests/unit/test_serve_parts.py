"""The server's pure parts, no server: a request's modelled times off a flow schedule (pinned by hand), the
request bodies' parsing (defaults, the K/V bound, chat turns), and `waferrt serve`'s flags refused before
anything loads (an open address without a key)."""

from __future__ import annotations

import pytest

from waferrt.cli import main
from waferrt.server.protocol import ApiError, Kind, Limits, parse
from waferrt.serving.modelled import ModelledTimes, request_times


def test_request_times_from_a_schedule_worked_by_hand():
    # request 7, a prompt of 3 (positions 0..2), 3 tokens: the first from position 2, the last from position 4.
    # Its first run starts at 1.0; position 2 leaves at 4.0 (TTFT 3.0); position 4 at 8.0: TPOT (8-4)/2 = 2.0.
    sched = {(7, 0, 0): ("r", 1.0, 2.0), (7, 1, 0): ("r", 2.0, 3.0), (7, 2, 0): ("r", 3.0, 3.5),
             (7, 2, 1): ("q", 3.5, 4.0), (7, 3, 0): ("r", 5.0, 6.0), (7, 4, 1): ("q", 7.0, 8.0),
             (8, 0, 0): ("r", 0.0, 9.0)}  # another request's: not counted
    assert request_times(sched, 7, 3, 3) == ModelledTimes(3.0, 2.0, 7.0)
    assert request_times(sched, 7, 3, 1) == ModelledTimes(3.0, None, 3.0)  # one token: no time per token
    assert request_times(sched, 9, 3, 3) == ModelledTimes()  # not in the schedule (a recovery crossed it)


class _Bytes:
    """A byte-level tokenizer: what the tests' GGUF is (each byte a token)."""

    stop_ids = (0,)

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def chat_turns(self, turns, system=None) -> str:
        from waferrt.model.tokenizer import Tokenizer

        return Tokenizer.chat_turns(self, turns, system)


LIMITS = Limits("tiny", 20, 256)


def test_a_completion_body_becomes_the_request_it_asks_for():
    got = parse({"model": "tiny", "prompt": "abc", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "seed": 3,
                 "stop": "x", "stream": True, "stream_options": {"include_usage": True}}, Kind.COMPLETION, LIMITS,
                _Bytes())
    assert got.prompt_ids == (97, 98, 99) and got.max_tokens == 5 and got.stop == ("x",) and got.stop_ids == (0,)
    assert got.sampler.greedy and got.sampler.top_p == 1.0 and got.stream and got.include_usage
    plain = parse({"prompt": [1, 2]}, Kind.COMPLETION, LIMITS, _Bytes())
    assert plain.max_tokens == 16 and plain.sampler.temperature == 1.0 and not plain.stream  # OpenAI's defaults
    assert parse({"prompt": "a", "ignore_eos": True}, Kind.COMPLETION, LIMITS, _Bytes()).stop_ids == ()


def test_the_kv_bound_and_the_chat_default_follow_the_slot():
    # 20 positions a slot: a prompt of 15 leaves room for 5 tokens, no more
    assert parse({"prompt": "a" * 15, "max_tokens": 5}, Kind.COMPLETION, LIMITS, _Bytes()).max_tokens == 5
    with pytest.raises(ApiError) as e:
        parse({"prompt": "a" * 15, "max_tokens": 6}, Kind.COMPLETION, LIMITS, _Bytes())
    assert e.value.status == 400 and e.value.param == "max_tokens" and "at most 5" in e.value.message
    wide = Limits("tiny", 200, 256)
    chat = parse({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]}, Kind.CHAT,
                 wide, _Bytes())
    text = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert bytes(chat.prompt_ids).decode() == text and chat.max_tokens == 200 - len(text)


@pytest.mark.parametrize("argv,says", [
    (["--host", "0.0.0.0"], "--api-key"),
    (["--http-faults"], "--api-key"),
    (["--compare-dense"], "generate's"),
    (["--chaos", "x"], "SEED:N"),
    (["--chaos", "1:0"], "SEED:N"),
    (["--port", "70000"], "--port"),
    (["--policy", "fail-fast"], "--chaos"),
])
def test_serve_refuses_bad_flags_in_one_line_before_anything_loads(argv, says, capsys):
    try:
        code = main(["serve", *argv])
    except SystemExit as e:  # argparse's own refusal
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
