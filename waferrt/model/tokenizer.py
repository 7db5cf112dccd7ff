"""Tokenizer: the GGUF's own byte-level BPE vocabulary, run by HuggingFace `tokenizers`.

Contract:
- Built only from the metadata stored in the GGUF (tokens, merges, token types, special ids); no network,
  no tokenizer.json. The pipeline is SmolLM's: no normaliser; pre-tokenise by splitting every digit on its
  own, then GPT-2 ByteLevel (regex split, no prefix space); BPE with the GGUF merges; ByteLevel decoding.
- Control tokens (GGUF token type 3: <|endoftext|>, <|im_start|>, <|im_end|>, ...) are special tokens:
  written literally in the text they encode to their single id.
- decode(encode(s)) == s for any str s whose UTF-8 bytes all have a byte token. SmolLM2's vocabulary lacks
  21 of the 256 byte tokens (control bytes 0x04 0x06 0x13 0x14 0x16 0x1d and lead bytes 0xc0 0xc1 0xf1 0xf2
  0xf5-0xff, so also all of planes 4-7); BPE would silently drop such bytes, so encode raises instead.
- `chat_prompt` renders SmolLM2-Instruct's ChatML template; `StreamDecoder` turns ids into text one token at
  a time without ever emitting half of a multi-byte UTF-8 character.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

CONTROL_TOKEN_TYPE = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@dataclass(frozen=True, eq=False)
class TokenizerMetadata:
    """The `tokenizer.ggml.*` entries of a GGUF."""

    model: str  # "gpt2" for byte-level BPE
    pre: str  # llama.cpp pre-tokeniser name, "smollm" for SmolLM2
    tokens: tuple[str, ...]
    merges: tuple[str, ...]  # "left right", in priority order
    token_types: tuple[int, ...]
    bos_id: int
    eos_id: int
    chat_template: str | None = None


class Tokenizer:
    """Text <-> token ids for a GGUF byte-level BPE model (SmolLM2)."""

    def __init__(self, meta: TokenizerMetadata) -> None:
        if meta.model != "gpt2":
            raise ValueError(
                f"tokenizer model {meta.model!r} is not supported; only byte-level BPE ('gpt2') GGUFs are"
            )
        if meta.pre != "smollm":
            raise ValueError(
                f"pre-tokeniser {meta.pre!r} is not supported; this tokenizer splits digits then applies the "
                "GPT-2 regex (llama.cpp 'smollm')"
            )
        self.meta = meta
        vocab = {tok: i for i, tok in enumerate(meta.tokens)}
        merges = [tuple(m.split(" ")) for m in meta.merges]
        bad = next((m for m in merges if len(m) != 2), None)
        if bad is not None:
            raise ValueError(f"merge {' '.join(bad)!r} is not two space-separated tokens")
        unknown = next((m for m in merges if not {m[0], m[1], m[0] + m[1]} <= vocab.keys()), None)
        if unknown is not None:
            raise ValueError(f"merge {' '.join(unknown)!r} joins tokens into one the vocabulary lacks "
                             f"({unknown[0] + unknown[1]!r}); the GGUF's tokenizer data is inconsistent")
        self._hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
        self._hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        self._hf.decoder = decoders.ByteLevel()
        self.special_ids = tuple(i for i, t in enumerate(meta.token_types) if t == CONTROL_TOKEN_TYPE)
        self._hf.add_special_tokens(
            [AddedToken(meta.tokens[i], special=True, normalized=False) for i in self.special_ids]
        )
        for i in self.special_ids:
            if self._hf.token_to_id(meta.tokens[i]) != i:
                raise ValueError(f"special token {meta.tokens[i]!r} did not keep its GGUF id {i}")
        present = bytes(b for b, ch in byte_chars().items() if ch in vocab)
        self.missing_bytes = frozenset(range(256)) - frozenset(present)
        self._present = present

    @property
    def vocab_size(self) -> int:
        return len(self.meta.tokens)

    @property
    def bos_id(self) -> int:
        return self.meta.bos_id

    @property
    def eos_id(self) -> int:
        return self.meta.eos_id

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a generation: eos (<|im_end|> for SmolLM2-Instruct) and <|endoftext|> if present."""
        eot = self._hf.token_to_id("<|endoftext|>")
        return (self.eos_id,) if eot is None or eot == self.eos_id else (self.eos_id, eot)

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry in its byte-level spelling ("Ġworld" for " world")."""
        return self._hf.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self.meta.tokens[token_id]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; no BOS is added (SmolLM2 does not use one).

        Raises ValueError naming the characters whose bytes the vocabulary cannot spell.
        """
        if text.encode("utf-8").translate(None, self._present):  # bytes left after deleting the spellable
            bad = sorted(c for c in set(text) if c.encode("utf-8").translate(None, self._present))
            raise ValueError(
                f"the vocabulary has no byte token for part of {', '.join(f'U+{ord(c):04X}' for c in bad)}; "
                "remove or replace these characters (BPE would silently drop them)"
            )
        return self._hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """The text of `ids`. Incomplete UTF-8 at the end decodes to U+FFFD; use StreamDecoder to stream."""
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary 0..{self.vocab_size - 1}")
        return self._hf.decode(list(ids), skip_special_tokens=skip_special)

    def chat_prompt(self, user_text: str, system: str | None = None) -> str:
        """SmolLM2-Instruct's ChatML prompt for one user turn, ending where the assistant's reply starts.

        system=None uses the model's default system prompt, as its chat template does.
        """
        return self.chat_turns([("user", user_text)], system)

    def chat_turns(self, turns: Sequence[tuple[str, str]], system: str | None = None) -> str:
        """The ChatML prompt of a conversation, (role, text) turns after the system prompt (None: the model's
        default), ending where the assistant's next reply starts."""
        system = DEFAULT_SYSTEM_PROMPT if system is None else system
        body = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
        return f"<|im_start|>system\n{system}<|im_end|>\n{body}<|im_start|>assistant\n"

def byte_chars() -> dict[int, str]:
    """GPT-2's byte -> one-character spelling used by ByteLevel (printable Latin-1 bytes stand for
    themselves, the other 68 bytes map to U+0100 onwards). Checked against the `tokenizers` alphabet."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [b for b in range(256) if b not in kept]
    table = {b: chr(b) for b in kept} | {b: chr(256 + i) for i, b in enumerate(moved)}
    if set(table.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("the ByteLevel alphabet of this `tokenizers` version is not GPT-2's byte table")
    return table


class StreamDecoder:
    """Incremental detokenisation: push ids one at a time, get back only complete new text.

    A token that ends inside a multi-byte UTF-8 character yields "" until the token that completes it.
    Only the ids since the last emitted text are re-decoded, so each push is O(1) in the stream length.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read] were already emitted; they give context to the next decode
        self._read = 0

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes ("" while a character is still incomplete)."""
        self._ids.append(token_id)
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        full = self._tok.decode(self._ids[self._prefix :], self._skip)
        if len(full) <= len(done) or full.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return full[len(done) :]

    def flush(self) -> str:
        """Text still held back at the end of the stream (an incomplete character decodes to U+FFFD)."""
        done = self._tok.decode(self._ids[self._prefix : self._read], self._skip)
        rest = self._tok.decode(self._ids[self._prefix :], self._skip)[len(done) :]
        self._prefix = self._read = len(self._ids)
        return rest
