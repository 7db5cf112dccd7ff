"""The ``waferrt`` command: one module per subcommand (generate, plan, estimate, sweep, chaos, demo, bench,
convert, train).

Contract: :func:`main(argv) -> int` parses the command line and runs one subcommand. Each subcommand is a module of
this package (:data:`COMMANDS`) with ``add_parser(subparsers)`` (registers its subparser and
``set_defaults(_run=run)``) and ``run(args) -> int``. Only the module that parsing needs is imported (all of them
for ``--help``), and importing them imports neither Ray nor pyzmq (``waferrt --help`` is instant). Every argument is
checked when it is parsed or right after, before a model is read or Ray starts: a mistake (or a file that could not
be written: a full disk) is one line ``waferrt <command>: <what was wrong and what to write>`` on stderr and exit
status 2, with no traceback. Ctrl-C exits 130 and SIGTERM 143, both after shutting the wafer down. Only the program
itself (``main()`` with no argv: the ``waferrt`` script, ``python -m waferrt.cli``) takes SIGTERM, and gives the
previous handler back when the command returns; ``main(argv)`` called in-process (a test, a notebook) leaves the
caller's signal handling alone, so that a SIGTERM still stops the caller (e.g. pytest).
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

# command name -> its module (add_parser(subparsers), run(args) -> int), in the order --help lists them
COMMANDS = {"generate": "waferrt.cli.generate", "plan": "waferrt.cli.plan", "estimate": "waferrt.cli.estimate",
            "sweep": "waferrt.cli.sweep", "chaos": "waferrt.cli.chaos", "demo": "waferrt.cli.demo",
            "convert": "waferrt.cli.convert", "train": "waferrt.cli.train", "serve": "waferrt.server.command",
            "bench": "waferrt.cli.bench"}

DESCRIPTION = """\
waferrt runs an emulated wafer-scale processor: a 2D mesh of small cores, each with its own few tens of
KB of SRAM and links only to its N/E/S/W neighbours, hosted as Ray actors that each own a tile of cores,
and decodes real LLMs on it. Data move only by neighbour hops; every run reports what it would cost on
the modelled wafer (hops, routing stages, link bytes, cycles) next to the wall time it took to emulate."""

EPILOG = """\
examples:
  waferrt generate "The capital of France is"   SmolLM2-135M decoded on an emulated WSE-2 mesh
  waferrt plan --png plan.png                   where every layer of it sits, SRAM per core
  waferrt estimate --model llama3-8b            Llama3-8B on a whole WSE-2, on paper: tokens/s, breakdown
  waferrt sweep --model llama3-8b --png s.png   which wafer design serves it best (SRAM, mesh, links, clock)
  waferrt chaos --faults 20 --seed 1            a seeded campaign of faults: recovered, tokens identical?
  waferrt demo                                  allreduce on an 8x8 mesh in 2x2 tiles of 4x4 cores
  waferrt convert --moe 8,2 moe.gguf            SmolLM2 cut into a mixture of 8 experts, 2 per token
  waferrt train --model tiny --steps 20         train a small Llama: forward, backward, AdamW (--streaming: on Ray)
  waferrt serve                                 an OpenAI-compatible server on http://127.0.0.1:8000
  waferrt demo --algo ring --spec wse2          same with the ring algorithm and WSE-2 timings
  waferrt demo --mesh 16x4 --tile 8x2           a non-square mesh (W x H cores, tiles of TW x TH)
  waferrt convert --shape llama3-8b --layers 2 --vocab 32768 l8b.gguf   Llama3-8B's real layers, 2 of them
  waferrt bench --request-rate 2                a load run against waferrt serve: TTFT, TPOT, ITL, goodput
  waferrt <command> --help                      options of one command

The mesh is W x H cores (x to the East, y to the South); each tile of TW x TH cores is one Ray actor.
Ray is started in-process unless --address names a running cluster (or "auto" to join the local one)."""


def _modules(argv: list[str]) -> list:
    """The subcommand modules that parsing `argv` needs: the named command's, or all (for --help)."""
    command = next((a for a in argv if not a.startswith("-")), None)
    names = [COMMANDS[command]] if command in COMMANDS else list(COMMANDS.values())
    return [importlib.import_module(name) for name in names]


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (what was wrong and what to write), not the usage block."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; with `argv`, only the subcommand modules that parsing `argv` needs are imported."""
    parser = Parser(prog="waferrt", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    from waferrt import __version__

    parser.add_argument("--version", action="version", version=f"waferrt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for module in _modules([] if argv is None else argv):
        module.add_parser(sub)
    return parser


class Terminated(Exception):
    """SIGTERM arrived: unwind like Ctrl-C, so that the wafer is shut down on the way out."""


_TERMINATED = threading.Event()  # SIGTERM came: whatever it unwound as (Ray wraps an exception raised
                                 # while it deserializes into its own RaySystemError), it was the signal


def _terminate(signum, frame) -> None:
    _TERMINATED.set()
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    from waferrt.actors.pool import BadKeepTiles
    from waferrt.actors.session import ClusterUnreachable
    from waferrt.core.files import WriteError

    from .common import UsageError

    program = argv is None  # the waferrt command itself: SIGTERM is its to handle
    argv = sys.argv[1:] if program else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    handles = program and threading.current_thread() is threading.main_thread()
    _TERMINATED.clear()
    previous = signal.signal(signal.SIGTERM, _terminate) if handles else None
    try:
        return int(args._run(args) or 0)
    except (UsageError, ClusterUnreachable, WriteError, BadKeepTiles) as e:  # the user's to fix: one line, no traceback
        print(f"waferrt {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("waferrt: interrupted; the wafer was shut down", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - SIGTERM's Terminated, as such or wrapped; anything else goes on
        if not (isinstance(e, Terminated) or _TERMINATED.is_set()):
            raise
        print("waferrt: terminated (SIGTERM); the wafer was shut down", file=sys.stderr)
        return 143
    finally:
        if handles:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
