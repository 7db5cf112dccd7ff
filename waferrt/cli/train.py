"""``waferrt train``: train a Llama on the emulated wafer -- resident, or weight-streaming on Ray.

Contract: ``add_parser(subparsers)`` registers the subcommand; ``run(args) -> int`` trains --model ('tiny',
the small synthetic Llama with a byte-level vocabulary of TINY_VOCAB tokens; 'smollm2'; or a Llama GGUF
path) for --steps AdamW steps on batches of --batch sequences of --seq tokens drawn (seeded) from the
project's own docs, tokenized by the model's tokenizer. Each step prints its loss, wall time, modelled wafer
time and tokens/s (stdout; one JSON object with --json); a bar counts the steps on a terminal. Resident (the
default): the weights, gradients and AdamW's moments stay in the region's SRAM (refused, one line, when they
do not fit: --streaming or a larger --mesh); --streaming: the weights and AdamW's state live in a MemoryX
actor off the wafer and stream in layer by layer (actors/training.py, on an embedded Ray); --fault makes a
tile die, a gradient payload arrive corrupted or a core of the kernels' square die (the step re-plans onto a
spare square of the same side), --chaos N draws N such faults (seeded by --seed); the step is redone and
the weights compared with a fault-free rerun's. --on mesh runs each layer's forward and backward and the
head's as mesh kernels on a Wafer (``training.mesh``; a block too large for the cores' SRAM is one line,
exit 2), reference the numpy functions (--backward is the old spelling of --on).
--save writes the trained weights as a GGUF that ``waferrt generate --model`` loads.
Every flag is checked before the weights load or Ray starts (but the block's fit, checked as its first
forward starts); a mistake is one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import numpy as np

from waferrt.core.cost import cycles_seconds
from waferrt.core.mesh import Extent
from waferrt.core.spec import PRESETS
from waferrt.faults.model import FaultKind

from . import train_report
from .common import UsageError, model_arg, output_path, parse_wxh, say, stamp, whole_number
from .progress import counter, line
from .train_report import Modelled, Start, Where

TINY_VOCAB = 264  # --model tiny: the 256 byte tokens, the merge "Ġt", unused padding
TINY_LR, FINE_TUNE_LR = 3e-3, 3e-5  # --lr's defaults: the tiny model learns from scratch; a real one is fine-tuned

HELP = "train a Llama on the emulated wafer (resident, or weight streaming as Cerebras does)"
EPILOG = """\
examples:
  waferrt train --model tiny --steps 20                       the small synthetic Llama, resident: seconds
  waferrt train --model tiny --steps 5 --check                each step's gradients against the numpy reference
  waferrt train --steps 6 --streaming --fault tile:2:1 --fault corrupt:4   faults during training, then compared
  waferrt train --steps 3 --mesh 16x8 --fault core:2:1,2       a dead core: the step moves to the spare 8x8 square
  waferrt train --steps 4 --mesh 16x8 --chaos 3 --seed 2       3 seeded faults, then compared with a fault-free run
  waferrt train --model tiny --steps 20 --save tiny.gguf      then: waferrt generate --model tiny.gguf --reference
  waferrt train --model smollm2 --steps 3 --batch 1 --seq 32 --streaming   SmolLM2-135M, weights off the wafer

The corpus is the project's own docs (README.md, docs/*.md) tokenized by the model's tokenizer; each step
draws --batch windows of --seq + 1 tokens (seeded by --seed). The modelled time is the step's on a region of
--mesh cores of the --spec wafer (default: 8x8 of wse2 for --model tiny, else 64x64; 32x32 --on mesh): each
layer's forward and backward and the head's as the mesh kernels book them, plus AdamW's closed form; under
--streaming every stage the longer of its compute and its stream (weights in, gradients out). --on mesh (the
default resident) runs those kernels on the region's largest square (a local Wafer; under --streaming the tile's
own); --on reference (the default --streaming) runs the numpy functions; --check compares each step's
gradients with the numpy reference's (model.backward.loss_and_grads) at the same weights.
Activations: every layer's, kept for its backward, stay in the square's SRAM at once; when they do not all fit,
the first layers keep only their input and re-run their forward just before their backward (the plan printed
first; the recomputed forwards' time is in the modelled time and printed per step).
--json prints one object: model, streaming, mesh, spec, steps (each: step, loss, wall_s, modelled_s,
modelled_recompute_s, bytes_in, bytes_out, wall_tokens_per_s, modelled_tokens_per_s; grad_error
with --check; recoveries and, last, identical_to_fault_free with --fault), saved."""


def _learning_rate(text: str) -> float:
    try:
        lr = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a learning rate such as 3e-3") from None
    if not 0 < lr < 1:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1); give a learning rate such as 3e-3")
    return lr


def _fault(text: str):
    from waferrt.training.faults import TrainingFault

    try:
        return TrainingFault.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help=HELP, description=__doc__.split("\n\n")[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=model_arg("tiny"), default="tiny",
                   help="'tiny' (default: a small synthetic Llama), 'smollm2' or a Llama GGUF path")
    p.add_argument("--steps", type=whole_number(1, "--steps 20", 100_000), default=20, metavar="N",
                   help="optimizer steps (20)")
    p.add_argument("--batch", type=whole_number(1, "--batch 4", 4096), default=4, metavar="B",
                   help="sequences per step (4)")
    p.add_argument("--seq", type=whole_number(1, "--seq 64", 1 << 16), default=64, metavar="S",
                   help="tokens per sequence (64)")
    p.add_argument("--lr", type=_learning_rate, default=None,
                   help="AdamW learning rate (3e-3 for the tiny model from scratch, 3e-5 to fine-tune a trained one)")
    p.add_argument("--seed", type=whole_number(0, "--seed 7", (1 << 63) - 1), default=0,
                   help="the batcher's seed (0)")
    p.add_argument("--streaming", action="store_true",
                   help="weight streaming: weights and AdamW state in a MemoryX actor off the wafer (Ray)")
    p.add_argument("--fault", type=_fault, action="append", metavar="KIND:STEP[:LAYER|:X,Y]",
                   help="tile:STEP[:LAYER] (--streaming: the tile dies pushing that layer's gradients), "
                        "corrupt:STEP[:LAYER] (that layer's gradient payload arrives corrupted), core:STEP[:X,Y] "
                        "(--on mesh: core X,Y of the kernels' square dies as layer 0's backward starts; the step "
                        "re-plans onto a spare square of a wider --mesh, e.g. 16x8); the step is redone from the "
                        "last good weights, and the weights compared with a fault-free run's")
    p.add_argument("--chaos", type=whole_number(1, "--chaos 4", 1000), metavar="N",
                   help="draw N faults (seeded by --seed) of the kinds this run recovers from (--streaming: tile, "
                        "corrupt; resident: corrupt; core too with --on mesh on a --mesh wider than tall), as --fault")
    p.add_argument("--on", "--backward", dest="on", choices=("mesh", "reference"), default=None,
                   help="mesh: each layer's forward and backward and the head's run as mesh kernels on the region's "
                        "largest square (booked; the default resident); reference: the numpy functions (the default "
                        "--streaming); --backward is its old spelling")
    p.add_argument("--mesh", type=parse_wxh, metavar="WxH",
                   help="the region the step runs and is modelled on (8x8 for --model tiny, else 64x64)")
    p.add_argument("--spec", choices=sorted(PRESETS), help="hardware spec (wse2)")
    p.add_argument("--save", type=output_path("trained.gguf"), metavar="OUT.gguf",
                   help="write the trained weights as a llama GGUF (F32) with the model's tokenizer")
    p.add_argument("--check", action="store_true",
                   help="each step, compare the gradients applied with the numpy reference's (model.backward) at the "
                        "same weights: prints the largest relative difference")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a line per step")
    p.set_defaults(_run=run)
    return p


def _load(args):
    """(config, weights() -> the float32 weights, tokenizer metadata, tokenizer) of --model."""
    from waferrt.model import Tokenizer

    if args.model == "tiny":
        from waferrt.model import synthetic_llama, tiny_config
        from waferrt.model.gguf_writer import Vocab, byte_vocabulary

        config = dataclasses.replace(tiny_config(), vocab_size=TINY_VOCAB)
        meta = byte_vocabulary(config, Vocab(("Ġ t",), ("Ġt",)))  # a GGUF's BPE has at least one merge
        return config, lambda: synthetic_llama(config, seed=0), meta, Tokenizer(meta)
    from .model import ModelLoad

    try:
        load = ModelLoad(args.model)
    except (OSError, ValueError) as e:
        raise UsageError(f"--model {args.model}: {e}") from None
    return load.config, load.weights, load.tokenizer.meta, load.tokenizer


def _mesh(args) -> Extent:
    """--mesh, or its default: 8x8 for --model tiny, 32x32 for a model on the mesh (a block fits, RoPE's pairs
    stay whole), else 64x64."""
    if args.mesh:
        return args.mesh
    return Extent(8, 8) if args.model == "tiny" else Extent(32, 32) if args.on == "mesh" else Extent(64, 64)


def _region(args, config) -> Where:
    """The --spec wafer's spec and the --mesh region on it (checked)."""
    from waferrt.core.mesh import Region
    from waferrt.core.spec import spec_by_name
    from waferrt.core.train_cost import TrainShape
    from waferrt.training.cost import resident_core_bytes, step_plan
    from waferrt.training.mesh import even_rope_blocks, mesh_side

    spec = spec_by_name(args.spec or "wse2")
    mesh = _mesh(args)
    w, h = mesh.width, mesh.height
    if w > spec.full_mesh.width or h > spec.full_mesh.height:
        raise UsageError(f"--mesh {mesh} is larger than the {spec.name} wafer's {spec.full_mesh} cores; give a "
                         "smaller --mesh or another --spec")
    region = Region(0, 0, w, h)
    need = resident_core_bytes(config, region)
    if not args.streaming and need > spec.sram_bytes:
        raise UsageError(f"resident training keeps the weights, gradients and AdamW moments in SRAM: {need:,} "
                         f"bytes per core on {w}x{h}, more than the {spec.sram_bytes:,} of a {spec.name} core; "
                         "add --streaming (weights off the wafer) or give a larger --mesh")
    asked = f"--batch {args.batch} --seq {args.seq} on --mesh {w}x{h}"
    try:  # the step's SRAM plan (kept or recomputed layers, the head in chunks) fits a core of the square
        plan = step_plan(spec, config, region, TrainShape(args.batch, args.seq))
    except ValueError as e:
        raise UsageError(f"{asked}: {e} (--batch, --seq, --mesh)") from None
    if not plan.fits:
        raise UsageError(f"{asked}: {plan.overflow(min(w, h), '(x=0, y=0)', spec.name)}; give fewer tokens or a "
                         "larger square (--batch, --seq, --mesh)")
    if args.on == "mesh" and not even_rope_blocks(config, region):
        side = mesh_side(config, region)
        raise UsageError(f"--on mesh runs on the largest square of --mesh {w}x{h}, whose cores' head_dim blocks "
                         f"(ceil({config.head_dim} / {min(w, h)})) split a RoPE pair; give --mesh {side}x{side} or "
                         "--on reference")
    return Where(spec, region)


def _check(args, config) -> None:
    from waferrt.model.backward import check_dense

    try:
        check_dense(config)
    except ValueError as e:
        raise UsageError(f"--model {args.model}: {e}") from None
    _check_faults(args, config)
    if args.seq > config.max_seq_len:
        raise UsageError(f"--seq {args.seq} is longer than the model's context of {config.max_seq_len} tokens; "
                         f"give --seq {min(64, config.max_seq_len)}")


def _kinds(args) -> tuple[FaultKind, ...]:
    """The fault kinds this run recovers from."""
    mesh = _mesh(args)
    core = (FaultKind.CORE,) if args.on == "mesh" and mesh.width != mesh.height else ()
    return (FaultKind.TILE, FaultKind.CORRUPT, *core) if args.streaming else (FaultKind.CORRUPT, *core)


def _check_faults(args, config) -> None:
    """--fault's faults fit the run (their kind, step, layer, core); --chaos's drawn (seeded) into args.fault."""
    from waferrt.training.faults import Run, draw

    kinds, side, spares = _kinds(args), min(_mesh(args)), (max(_mesh(args)) - min(_mesh(args))) // min(_mesh(args))
    if args.chaos:
        try:
            drawn = draw(args.chaos, args.seed, Run(args.steps, config.n_layers, kinds, side, spares))
        except ValueError as e:
            raise UsageError(f"--chaos {args.chaos}: {e}") from None
        say(f"--chaos {args.chaos} --seed {args.seed}: {', '.join(map(str, drawn))}")
        args.fault = [*(args.fault or ()), *drawn]
    for f in args.fault or ():
        if f.kind not in kinds:
            raise UsageError(f"--fault {f}: this run recovers from {', '.join(kinds)} faults (tile: --streaming; "
                             "core: resident, --on mesh, a --mesh wider than tall, e.g. 16x8, for its spare squares)")
        if f.step > args.steps or f.layer >= config.n_layers or max(f.core) >= side:
            raise UsageError(f"--fault {f} strikes outside the run: give a step of 1..{args.steps}, a layer of 0.."
                             f"{config.n_layers - 1} and a core of 0..{side - 1},0..{side - 1}")


def _corpus(args, tokenizer):
    import waferrt
    from waferrt.training.corpus import Batcher, Corpus, project_text

    try:
        text = project_text(Path(waferrt.__file__).resolve().parents[1])
        corpus = Corpus.encode(text, tokenizer.encode)
        return Batcher(corpus, args.batch, args.seq, args.seed), corpus.ids.size
    except (OSError, ValueError) as e:
        raise UsageError(str(e)) from None


def _trainer(args, start: Start, where: Where, faults=None):
    """(the trainer, stop: what to call when done) -- in this process, or on an embedded Ray (--streaming); the
    phases on a Wafer of the --mesh region's cores (--on mesh) or the numpy reference's; `faults` (default
    --fault's) planned."""
    from waferrt.runtime import Wafer

    config, weights, hp = start.config, start.weights, start.hp
    mesh = None
    if args.on == "mesh":  # the Wafer the kernels run on: made here, or in the tile actor (--streaming)
        size = Extent(where.region.w, where.region.h)
        mesh = functools.partial(Wafer, where.spec, mesh=size, tile=size, backend="local")
    faults = args.fault or () if faults is None else faults
    if not args.streaming:
        from waferrt.training.mesh import phases_of
        from waferrt.training.resident import ResidentTraining

        wafer = None if mesh is None else mesh().open()
        trainer = ResidentTraining(config, weights, hp, phases_of(args.on, wafer), wafer, faults)
        return trainer, (wafer.close if wafer else lambda: None)
    from waferrt.actors.session import ray_init, ray_shutdown
    from waferrt.actors.training import StreamingTraining
    from waferrt.model.npcache import by_reference

    say("starting Ray: MemoryX (weights and AdamW state off the wafer) and the streaming region's tile")
    started = ray_init(None)
    try:
        trainer = StreamingTraining(config, by_reference(weights), hp, faults, mesh)
        return trainer, (ray_shutdown if started else lambda: None)
    except BaseException:
        if started:
            ray_shutdown()
        raise


def run(args) -> int:
    from waferrt.core.train_cost import TrainShape
    from waferrt.fabric.misuse import BlockTooLarge
    from waferrt.training.adamw import AdamW
    from waferrt.training.cost import step_cycles, step_plan
    from waferrt.training.faults import TrainingFailed

    config, weights, meta, tokenizer = _load(args)
    args.on = args.on or ("reference" if args.streaming else "mesh")
    _check(args, config)
    where = _region(args, config)
    spec, region = where.spec, where.region
    batcher, n_tokens = _corpus(args, tokenizer)
    shape = TrainShape(args.batch, args.seq)
    cycles = step_cycles(spec, config, region, shape, args.streaming)
    modelled = Modelled(cycles.seconds(spec), cycles_seconds(spec, cycles.recompute))
    say(f"corpus: the project's docs, {n_tokens:,} tokens; {args.steps} steps of {args.batch} x {args.seq} tokens, "
        f"{'weight streaming' if args.streaming else 'resident'} on {region.w}x{region.h} cores of {spec.name}")
    side = min(region.w, region.h)
    say(f"the {side}x{side} square's SRAM: {step_plan(spec, config, region, shape)}")
    if args.check and args.on == "mesh":
        say(f"--check: each step's weight gradients, from the mesh kernels on {side}x{side} cores, against "
            "model.backward.loss_and_grads (numpy) at the same weights: the largest difference relative to the "
            "largest entry of that weight's reference gradient")
    elif args.check:
        say("--check: each step's gradients from the numpy reference's phases against central differences of the "
            f"reference's loss (+-{train_report.FD_EPS:g}) at the largest entry of 4 weights (an independent check)")
    ledger = args.on == "mesh" and not args.streaming
    say("modelled: " + ("each step's cycles as the mesh's ledger booked them, + AdamW's" if ledger else
                        "the closed form of a step (training.cost.step_cycles)"))
    hp = AdamW(lr=args.lr or (TINY_LR if args.model == "tiny" else FINE_TUNE_LR))
    start = Start(config, weights(), hp)
    trainer, stop = _trainer(args, start, where)
    try:
        def row(i, report, wall, booked):  # booked: the cycles the mesh's ledger took for the step, or None
            seconds = modelled if booked is None else Modelled((booked + cycles.optimizer) / spec.clock_hz,
                                                               modelled.recompute_s)
            return train_report.row(i, report, wall, seconds, shape)

        rows = _steps(args, config, trainer, batcher, row)
        saved = _save(args, config, trainer.weights(), meta) if args.save else None
        if args.fault:
            rows[-1]["identical_to_fault_free"] = _fault_free(args, dataclasses.replace(start, weights=weights()),
                                                              batcher, trainer, where)
    except TrainingFailed as e:
        raise UsageError(f"training failed: {e}") from None
    except BlockTooLarge as e:  # on Ray, the tile's error with its traceback: its last line is the cause
        cause = str(e).strip().splitlines()[-1].split("BlockTooLarge: ")[-1]
        raise UsageError(f"--on mesh: {cause} (--mesh, --batch, --seq), or write --on reference") from None
    finally:
        trainer.close()
        stop()
    train_report.summary(args, rows, saved, where)
    return 0


def _steps(args, config, trainer, batcher, row) -> list[dict]:
    """Run the steps: a line per step (its --check, its recoveries), the bar; the rows of the JSON."""
    rows, seen = [], 0
    for i in range(1, args.steps + 1):
        tokens, before = batcher.rows(i - 1), train_report.copy(config, trainer.weights()) if args.check else None
        t0, booked = time.perf_counter(), _booked(args, trainer)
        report = trainer.step(tokens, i)
        wall, after = time.perf_counter() - t0, _booked(args, trainer)
        rows.append(row(i, report, wall, None if after is None else after - booked))
        if before is not None:
            check = train_report.grad_error if args.on == "mesh" else train_report.fd_error
            rows[-1]["grad_check"] = "the numpy reference" if args.on == "mesh" else "finite differences"
            rows[-1]["grad_error"] = check(config, before, tokens, trainer.last_grads())
        recoveries = trainer.recoveries[seen:]
        seen += len(recoveries)
        for text in recoveries:
            say(f"fault: {text}")
        if args.fault:
            rows[-1]["recoveries"] = recoveries
        if not args.json:
            line(train_report.text(rows[-1], args.steps), sys.stdout)
        counter("training", i, args.steps, "steps", stamp())
    return rows


def _booked(args, trainer) -> float | None:
    """The cycles the mesh's ledger holds so far (a resident --on mesh run's Wafer, ResidentTraining.wafer), or
    None (no ledger in this process: the reference's phases, or the streaming tile's Wafer in its actor)."""
    if args.on != "mesh" or args.streaming:
        return None
    return trainer.wafer.cost().total.cycles


def _fault_free(args, start: Start, batcher, trainer, where: Where) -> bool:
    """Train the same steps again from `start` without faults: are the weights the faulted run's, bit for bit?"""
    from waferrt.model.backward import named_arrays

    say("the same steps without faults, to compare the weights")
    clean, stop = _trainer(args, start, where, faults=())
    try:
        for i in range(1, args.steps + 1):
            clean.step(batcher.rows(i - 1), i)
        want = named_arrays(clean.weights())
    finally:
        clean.close()
        stop()
    got = named_arrays(trainer.weights())
    same = all(np.array_equal(got[n], a) for n, a in want.items())
    say(f"weights identical to the fault-free run's: {'yes' if same else 'NO'}")
    return same


def _save(args, config, weights, meta) -> str:
    from waferrt.core.files import atomic_path
    from waferrt.model.gguf_writer import write_model

    with atomic_path(args.save) as tmp:  # a full disk or a Ctrl-C keeps the file that was there
        write_model(tmp, config, weights, meta)
    say(f"saved the trained weights to {args.save} (waferrt generate --model {args.save})")
    return args.save
