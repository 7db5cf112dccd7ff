"""The OpenAI-compatible request bodies, checked field by field, and the errors that answer bad ones.

Contract: :func:`parse(body, kind, limits, tok)` turns the JSON body of ``/v1/completions`` (``Kind.COMPLETION``)
or ``/v1/chat/completions`` (``Kind.CHAT``) into an :class:`Asked` (prompt ids, how many tokens, the
sampler, stop strings and ids, streaming), or raises :class:`ApiError` with the status, the OpenAI error type
and the field (``param``) that was wrong and what to write instead. The fields are vLLM's OpenAI server's:
``model``, ``prompt`` (text, or token ids) / ``messages``, ``max_tokens`` (chat: also
``max_completion_tokens``), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``n`` (1 only),
``ignore_eos``, ``stream``, ``stream_options.include_usage``; fields this server does not do (logprobs,
echo, penalties, best_of > 1, tools) are refused when set, other unknown fields ignored, as vLLM does. A
request whose prompt plus max tokens no K/V slot can ever hold is refused here (400), before it is queued.
Pure: no sockets.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from waferrt.model.sampling import Sampler

MAX_STOPS = 4  # OpenAI's limit on stop strings
MAX_SEED = (1 << 63) - 1
REFUSED_IF_SET = {"logprobs": None, "top_logprobs": None, "echo": False, "best_of": 1, "suffix": None,
                  "presence_penalty": 0, "frequency_penalty": 0, "logit_bias": None, "tools": None,
                  "tool_choice": None, "response_format": None}


class Kind(enum.Enum):
    COMPLETION = "text_completion"
    CHAT = "chat.completion"


class ApiError(Exception):
    """An OpenAI-shaped error: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param)


@dataclass(frozen=True)
class Limits:
    """What the served model can hold: its name, a request's K/V positions, its vocabulary."""

    model: str
    kv_tokens: int
    vocab: int


@dataclass(frozen=True)
class Asked:
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampler: Sampler
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()
    stream: bool = False
    include_usage: bool = False


def parse(body, kind: Kind, limits: Limits, tok) -> Asked:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object, e.g. {\"model\": ..., \"prompt\": \"Hello\"}")
    model = body.get("model", limits.model)
    if model != limits.model:
        raise ApiError(404 if isinstance(model, str) else 400,
                       f"the model {model!r} does not exist; this server serves {limits.model!r}",
                       "not_found_error" if isinstance(model, str) else "invalid_request_error", "model")
    for field, default in REFUSED_IF_SET.items():
        v = body.get(field)
        if v is not None and v is not False and v != default:
            raise bad(f"{field} is not supported by this server; leave it out", field)
    if _get(body, "n", int, 1) != 1:
        raise bad("n must be 1 (one choice per request); send several requests instead", "n")
    ids = _prompt(body, tok, limits) if kind is Kind.COMPLETION else _messages(body, tok)
    return Asked(ids, _max_tokens(body, kind, limits, len(ids)), _sampler(body), _stop(body),
                 () if _get(body, "ignore_eos", bool, False) else tuple(tok.stop_ids), *_streaming(body))


def _get(body: dict, field: str, typ, default):
    v = body.get(field, default)
    if v is None:
        return default
    ok = isinstance(v, typ) and not (typ in (int, float) and isinstance(v, bool))
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        ok, v = True, float(v)
    if not ok:
        raise bad(f"{field} must be {'a number' if typ is float else 'an integer' if typ is int else typ.__name__}, "
                  f"not {type(v).__name__} {v!r}", field)
    return v


def _prompt(body: dict, tok, limits: Limits) -> tuple[int, ...]:
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one
    if isinstance(p, str):
        return _encode(tok, p, "prompt")
    if isinstance(p, list) and p and all(isinstance(i, int) and not isinstance(i, bool) for i in p):
        if not all(0 <= i < limits.vocab for i in p):
            raise bad(f"prompt token ids must be in 0..{limits.vocab - 1}", "prompt")
        return tuple(p)
    if isinstance(p, list) and len(p) > 1:
        raise bad("one prompt per request (a batch of several prompts is not supported); send several requests",
                  "prompt")
    raise bad("prompt must be a non-empty string or a list of token ids, e.g. \"prompt\": \"Hello\"", "prompt")


def _encode(tok, text: str, param: str) -> tuple[int, ...]:
    try:
        ids = tuple(tok.encode(text))
    except ValueError as e:
        raise bad(str(e), param) from None
    if not ids:
        raise bad(f"{param} is empty: give at least one token of text", param)
    return ids


ROLES = ("system", "user", "assistant")


def _messages(body: dict, tok) -> tuple[int, ...]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list of {\"role\": \"user\", \"content\": \"...\"}", "messages")
    turns, system = [], None
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"messages[{i}] must be an object with a role of {', '.join(ROLES)}", "messages")
        text = _content(m.get("content"), i)
        if m["role"] == "system" and i == 0:
            system = text
        else:
            turns.append((m["role"], text))
    return _encode(tok, tok.chat_turns(turns, system), "messages")


def _content(c, i: int) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                   for p in c):
        return "".join(p["text"] for p in c)
    raise bad(f"messages[{i}].content must be text, or a list of {{\"type\": \"text\", \"text\": ...}} parts",
              "messages")


def _max_tokens(body: dict, kind: Kind, limits: Limits, prompt_len: int) -> int:
    room = limits.kv_tokens - prompt_len
    if room < 1:
        raise bad(f"the prompt has {prompt_len} tokens but a request's K/V holds {limits.kv_tokens} positions for "
                  f"the prompt and the new tokens together: shorten it to at most {limits.kv_tokens - 1} tokens "
                  "(or serve with a larger --kv-tokens)", "messages" if kind is Kind.CHAT else "prompt")
    field = "max_completion_tokens" if kind is Kind.CHAT and body.get("max_completion_tokens") is not None \
        else "max_tokens"
    n = _get(body, field, int, 16 if kind is Kind.COMPLETION else room)
    if n < 1:
        raise bad(f"{field} must be at least 1, not {n}", field)
    if prompt_len + n > limits.kv_tokens:
        raise bad(f"the prompt ({prompt_len} tokens) plus {field} {n} need {prompt_len + n} K/V positions but a "
                  f"request holds {limits.kv_tokens}: ask for at most {room} (or serve with a larger --kv-tokens)",
                  field)
    return n


def _sampler(body: dict) -> Sampler:
    t = _get(body, "temperature", float, 1.0)  # OpenAI's default; 0: greedy
    if not 0 <= t <= 2:
        raise bad(f"temperature must be in [0, 2], not {t}", "temperature")
    p = _get(body, "top_p", float, 1.0)
    if not 0 < p <= 1:
        raise bad(f"top_p must be in (0, 1], not {p}", "top_p")
    k = _get(body, "top_k", int, 0)
    if k < -1:
        raise bad(f"top_k must be -1 or 0 (all tokens) or a positive count, not {k}", "top_k")
    seed = _get(body, "seed", int, 0)
    if not 0 <= seed <= MAX_SEED:
        raise bad(f"seed must be in 0..{MAX_SEED}, not {seed}", "seed")
    if t == 0 and (p < 1 or k > 0):
        p, k = 1.0, 0  # greedy: the cuts change nothing
    return Sampler(temperature=t, top_k=max(k, 0), top_p=p, seed=seed)


def _stop(body: dict) -> tuple[str, ...]:
    s = body.get("stop")
    stops = () if s is None else (s,) if isinstance(s, str) else s
    if not isinstance(stops, (list, tuple)) or not all(isinstance(x, str) and x for x in stops):
        raise bad("stop must be a non-empty string or a list of them", "stop")
    if len(stops) > MAX_STOPS:
        raise bad(f"at most {MAX_STOPS} stop strings, not {len(stops)}", "stop")
    return tuple(stops)


def _streaming(body: dict) -> tuple[bool, bool]:
    stream = _get(body, "stream", bool, False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not stream:
        raise bad("stream_options is only for \"stream\": true; leave it out or set stream", "stream_options")
    if not isinstance(opts, dict):
        raise bad("stream_options must be an object, e.g. {\"include_usage\": true}", "stream_options")
    return stream, _get(opts, "include_usage", bool, False)
