"""What the subcommands share: argument types that check what they are given, the mesh check, progress lines.

Contract: every argparse ``type`` here either returns the value or raises ``ArgumentTypeError`` with one line that
names the value and what to write instead (argparse then exits with status 2 before anything is loaded):
:func:`parse_wxh` ("WIDTHxHEIGHT"), :func:`whole_number` (integers with a least value), :func:`temperature`,
:func:`top_p`, :func:`prompt`, :func:`prompt_file` (a UTF-8 text file: its non-blank lines), :func:`model_path`
(:func:`model_arg` with a command's own named models), :func:`output_path` / :func:`png_path` (a file to write: its
directory must exist and be writable, the path is no directory, device or FIFO (waferrt.core.files, which writes it
whole); a picture's name ends in .png, .svg, ...), :func:`number_list` (positive finite numbers up to a bound) and
:func:`ray_address` (a Ray cluster answers there: a socket with a deadline, before Ray is asked).
:func:`check_context` and :func:`check_kv_tokens` hold prompts, new tokens and --kv-tokens to the model's context
(one place for every command). :class:`UsageError` is a mistake found after parsing (``main`` prints it as ``waferrt
<command>: <message>`` and exits 2, no traceback); :func:`checked_mesh` turns --mesh/--tile into a MeshSpec that
fits the --spec wafer and stays within --max-tiles (:func:`check_max_tiles`: the mesh planned without --mesh too).
:func:`say` prints a progress line to stderr, stamped with the seconds since the command started ("i/n" counters are
progress bars on a terminal).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
import time
from collections.abc import Callable

from waferrt.core.files import not_regular
from waferrt.core.mesh import DEFAULT_MAX_TILES, Extent, MeshSpec, check_on_wafer, check_tile_count
from waferrt.core.spec import spec_by_name


class UsageError(ValueError):
    """A mistake in the command line found after parsing; printed as one line, exit status 2."""


_T0 = time.perf_counter()


def two_numbers(text: str, sep: str, form: str, example: str) -> tuple[int, int]:
    """'A<sep>B' -> (A, B), two whole numbers (the ranges are the caller's); ArgumentTypeError naming `form`."""
    try:
        a, b = (int(p) for p in text.split(sep))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {form}: write two whole numbers joined by {sep!r}, "
                                         f"e.g. {example}") from None
    return a, b


def parse_wxh(text: str) -> Extent:
    """'16x8' -> Extent(16, 8): width x height, both positive integers (argparse type)."""
    w, h = two_numbers(text.lower().replace("×", "x"), "x", "WIDTHxHEIGHT", "8x8 or 16x4")
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be at least 1, e.g. 8x8")
    return Extent(w, h)


MOST = 1 << 24  # the largest count a flag takes unless it says otherwise (K/V tokens, cores, tiles, ...)
MAX_REQUESTS = 1 << 16  # requests in flight
MAX_SEED = (1 << 63) - 1


def whole_number(least: int, example: str, most: int = MOST) -> Callable[[str], int]:
    """An argparse type for an integer in [`least`, `most`] (`example` shows a good value); the bound keeps a
    huge number from overflowing the planner's arithmetic or running for hours."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; write e.g. {example}") from None
        if n < least:
            raise argparse.ArgumentTypeError(f"{n} is less than {least}: give a whole number >= {least}, "
                                             f"e.g. {example}")
        if n > most:
            raise argparse.ArgumentTypeError(f"{n:,} is more than {most:,}: give a whole number from {least} to "
                                             f"{most}, e.g. {example}")
        return n

    return parse


def number_list(what: str, most: float, example: str) -> Callable[[str], tuple[float, ...]]:
    """An argparse type for comma-separated finite numbers in (0, `most`] (`what`: their unit)."""
    def parse(text: str) -> tuple[float, ...]:
        try:
            out = tuple(float(v) for v in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers; write e.g. "
                                             f"{example}") from None
        if not all(0 < x <= most for x in out):  # NaN fails this too
            raise argparse.ArgumentTypeError(f"{text!r}: every value is {what}, a number in (0, {most:g}]; write "
                                             f"e.g. {example}")
        return out

    return parse


def _number(text: str, what: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; {what}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number; {what}")
    return x


def temperature(text: str) -> float:
    """Sampling temperature: a finite number >= 0 (0 is greedy)."""
    what = "the temperature is a number >= 0 (0 = greedy, e.g. 0.8)"
    t = _number(text, what)
    if t < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative; {what}")
    return t


def top_p(text: str) -> float:
    """Nucleus sampling mass: a number in (0, 1] (1 keeps every token)."""
    what = "top-p is the probability mass kept, a number in (0, 1] (1 = off, e.g. 0.9)"
    p = _number(text, what)
    if not 0 < p <= 1:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1]; {what}")
    return p


def prompt(text: str) -> str:
    """A prompt: any non-empty text."""
    if not text:
        raise argparse.ArgumentTypeError('a prompt is empty: give some text, e.g. waferrt generate "Hello"')
    return text


MAX_PROMPT_FILE = 16 << 20  # bytes of prompts read from a --file


def not_a_file(path: str) -> str:
    """Why `path` is not a regular file to read ('' when it is): a device or a pipe would be read forever."""
    if os.path.isfile(path):
        return ""
    if os.path.isdir(path):
        return "is a directory"
    return "is not a regular file (a device, a pipe or a socket)" if os.path.exists(path) else "does not exist"


def prompt_file(path: str) -> tuple[str, ...]:
    """The non-blank lines of a UTF-8 text file (one prompt each, at most MAX_PROMPT_FILE bytes in all)."""
    if os.path.exists(path) and not_a_file(path):
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: it {not_a_file(path)}; give a UTF-8 text file with "
                                         "one prompt per line")
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PROMPT_FILE + 1)
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {e.strerror}") from None
    if len(data) > MAX_PROMPT_FILE:
        raise argparse.ArgumentTypeError(f"{path!r} holds more than {MAX_PROMPT_FILE >> 20} MB: give a file of "
                                         "prompts, one per line, not a corpus")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (Windows editors) is no part of the prompt
        if "\0" in text:
            raise ValueError
    except ValueError:  # UnicodeDecodeError included
        raise argparse.ArgumentTypeError(f"{path!r} is not a text file (it holds binary data); give a UTF-8 "
                                         "text file with one prompt per line") from None
    return tuple(line for line in text.splitlines() if line.strip())


def model_arg(*names: str) -> Callable[[str], str]:
    """An argparse type for --model: 'smollm2', one of the command's own `names` (e.g. 'tiny'), or the path of
    an existing file (whether it is a usable GGUF is checked when it is read); the one line names them all."""
    named = ("smollm2", *names)

    def check(text: str) -> str:
        if text not in named and not_a_file(text):
            others = "".join(f", {n!r}" for n in names)
            raise argparse.ArgumentTypeError(f"{text!r} {not_a_file(text)}: give 'smollm2' (the built-in "
                                             f"SmolLM2-135M){others} or the path of a llama GGUF file")
        return text

    return check


model_path = model_arg()  # 'smollm2' or a GGUF path


IMAGE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")  # what matplotlib writes without a backend of its own


def output_path(example: str) -> Callable[[str], str]:
    """An argparse type for a file to write (`example`: a good name): not a directory, in a directory that
    exists and is writable; an `example` ending in .png asks for a picture (IMAGE_SUFFIXES)."""
    def check(text: str) -> str:
        folder = os.path.dirname(os.path.abspath(text))
        if os.path.isdir(text):
            raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file name, e.g. "
                                             f"{text.rstrip('/')}/{example}")
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(f"{folder!r} is a file, not a directory: give a path in a directory, "
                                             f"e.g. {example}")
        if not os.path.isdir(folder):
            raise argparse.ArgumentTypeError(f"the directory {folder!r} does not exist: create it first, or give "
                                             f"a path in an existing directory (e.g. {example})")
        if not_regular(text):  # a device or a FIFO: replaced by a file, or a write that blocks forever
            raise argparse.ArgumentTypeError(f"cannot write {text!r}: it {not_regular(text)}; give the name of a "
                                             f"regular file, e.g. {example}")
        why = _unwritable(folder) or (os.path.exists(text) and not os.access(text, os.W_OK) and "read-only file")
        if why:
            raise argparse.ArgumentTypeError(f"cannot write {text!r} ({why}): give a path in a directory you can "
                                             f"write to (e.g. {example})")
        if example.endswith(".png") and not text.lower().endswith(IMAGE_SUFFIXES):
            raise argparse.ArgumentTypeError(f"{text!r} is not a picture's name: end it in "
                                             f"{', '.join(IMAGE_SUFFIXES)}, e.g. {example}")
        return text

    return check


png_path = output_path("plan.png")  # a picture to write


def _unwritable(folder: str) -> str:
    """Why no file can be made in `folder` ('' when one can): tried, as permissions alone do not tell (root, a
    read-only mount, /proc)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return ""
    except OSError as e:
        return e.strerror or str(e)


def ray_address(text: str) -> str:
    """'auto', HOST:PORT or ray://HOST:PORT where a Ray cluster answers (tried for a few seconds)."""
    from waferrt.actors.session import ClusterUnreachable, check_address

    try:
        check_address(text)
    except (ValueError, ClusterUnreachable) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_max_tiles(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tiles", type=whole_number(1, "--max-tiles 512"), default=DEFAULT_MAX_TILES, metavar="N",
                   help=f"refuse meshes of more than N tile actors, each a Ray process (default {DEFAULT_MAX_TILES})")


def refuse_together(args, flag: str, others: tuple[str, ...], why: str) -> None:
    """UsageError when `flag` and any of `others` (options, e.g. "--mesh") are both given (not None/False/0):
    `why` says what to do."""
    def given(option: str) -> bool:
        return getattr(args, option.lstrip("-").replace("-", "_")) not in (None, False)

    if given(flag):
        for other in others:
            if given(other):
                raise UsageError(f"{flag} and {other} do not go together: {why}")


def check_kv_tokens(kv_tokens: int, config, label: str = "the model") -> None:
    """UsageError when --kv-tokens reserves more K/V positions than the model's context (`label` names it)."""
    if kv_tokens > config.max_seq_len:
        raise UsageError(f"--kv-tokens {kv_tokens:,} is more than {label}'s context of {config.max_seq_len:,} "
                         f"positions; give at most --kv-tokens {config.max_seq_len}")


def check_context(requests, config) -> None:
    """UsageError when a request's prompt and new tokens (GenRequest's prompt_ids, max_new_tokens) need more
    positions than the model's context: the one check of generate (wafer and --reference) and chaos."""
    most = config.max_seq_len
    for i, r in enumerate(requests):
        n = len(r.prompt_ids)
        if n + r.max_new_tokens > most:
            fix = (f"give --max-new-tokens {most - n} or less" if n < most else
                   f"shorten it to fewer than {most} tokens")
            raise UsageError(f"prompt {i} is {n:,} tokens and --max-new-tokens {r.max_new_tokens:,} asks for "
                             f"{n + r.max_new_tokens:,} positions, more than the model's context of {most:,}: {fix}")


def check_max_tiles(args, mesh: MeshSpec) -> None:
    """UsageError when the mesh a command planned on -- the default one too, which no --mesh checked -- has more
    than --max-tiles tiles, naming the --mesh/--tile (or --max-tiles) that would do."""
    try:
        check_tile_count(mesh, args.max_tiles)
    except ValueError as e:
        fix = "" if args.mesh else (f"; the default mesh here is {mesh.width}x{mesh.height} cores: give e.g. --mesh "
                                    f"{mesh.width}x{mesh.height} --tile {mesh.width}x{mesh.height} for one tile")
        raise UsageError(f"{e}{fix}") from None


def checked_mesh(args, default_tile: Callable[[Extent], Extent]) -> MeshSpec | None:
    """The MeshSpec of --mesh and --tile (--tile defaults to `default_tile(--mesh)`; None without --mesh),
    checked to fit on the --spec wafer and to have at most --max-tiles tiles; UsageError otherwise."""
    if args.mesh is None:
        if args.tile is not None:
            raise UsageError("--tile needs --mesh (without --mesh the default mesh picks its own tiles)")
        return None
    size = args.mesh
    tile = args.tile or default_tile(size)
    try:
        mesh = MeshSpec(size.width, size.height, tile.width, tile.height)
        check_on_wafer(mesh, spec_by_name(args.spec))
        check_tile_count(mesh, args.max_tiles)
    except ValueError as e:  # MeshTooLarge, TooManyTiles, a tile larger than the mesh
        raise UsageError(str(e)) from None
    return mesh


_COUNTER = re.compile(r"(\d+)/(\d+)")


def say(msg: str) -> None:
    """Progress on stderr, stamped; an "i/n" counter is a bar on a terminal and only its n/n line elsewhere
    (waferrt.cli.progress)."""
    from . import progress

    m = _COUNTER.search(msg)
    if m:
        progress.counter(msg[:m.start()].rstrip(": "), int(m.group(1)), int(m.group(2)), msg[m.end():].strip(),
                         stamp())
    else:
        progress.line(f"{stamp()} {msg}")


def stamp() -> str:
    """[waferrt 12.3s]: seconds since the command started, so a user sees where the time goes."""
    return f"[waferrt {time.perf_counter() - _T0:5.1f}s]"
