"""Break each owner of a cost fact on purpose and show which unit tests catch it (issue 17).

Usage: python benchmarks/breaks.py [--only NAME ...] [--markdown]

For every break below, a fresh interpreter imports waferrt, replaces ONE owner (a function, everywhere it
was imported by name, or a method on its class) by a subtly wrong version, and runs the unit test files
listed for it; the script prints, per break, the tests that failed. A break that no test catches is a gap:
the script says so and exits 1. Nothing is changed on disk; each run is its own process.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = {  # the fast unit test files that tie the cost model, by what they cover
    "cost": ["tests/unit/test_pins.py", "tests/unit/test_owners.py", "tests/unit/test_collectives.py",
             "tests/unit/test_fast_path.py"],
    "decode": ["tests/unit/test_owners.py", "tests/unit/test_estimate_emulator.py",
               "tests/unit/test_decode_numbers.py", "tests/unit/test_pins.py"],
    "stream": ["tests/unit/test_pins.py", "tests/unit/test_owners.py", "tests/unit/test_streaming.py",
               "tests/unit/test_ties.py::test_the_paper_streaming_estimate_is_what_the_streaming_tiles_book"],
    "prefill": ["tests/unit/test_prefill_layer.py", "tests/unit/test_prefill_estimate.py"],
    "train": ["tests/unit/test_gemm_backward.py", "tests/unit/test_train_kernels.py",
              "tests/unit/test_block_backward.py", "tests/unit/test_train_ties.py", "tests/unit/test_pins.py"],
}

# name -> (module, attribute (Class.method for a method), the broken version as source over `orig`, files)
BREAKS = {
    "Topology.line_hops: the torus's wrap ignored": (
        "waferrt.core.topology", "Topology.line_hops",
        "lambda self, n, a, b: abs(a - b) if self.kind == 'torus' else orig(self, n, a, b)",
        ["tests/unit/test_topology.py"]),
    "alltoall_load: a torus link one chunk lighter": (
        "waferrt.core.topology", "alltoall_load",
        "lambda t, n: (lambda l: l if t.kind != 'torus' or n < 2 else __import__('dataclasses').replace("
        "l, busiest=l.busiest - 1))(orig(t, n))", ["tests/unit/test_topology.py"]),
    "HardwareSpec.on_line: every line of a torus wraps": (
        "waferrt.core.spec", "HardwareSpec.on_line", "lambda self, axis, n, wafer=None: self",
        ["tests/unit/test_topology.py", "tests/unit/test_ties.py"]),
    "glue_flops: the prefill's second residual add left out": (
        "waferrt.decode.prefill", "glue_flops", "lambda config, tokens: orig(config, tokens)[:-1]", FILES["prefill"]),
    "model_flops_per_token: attention left out": (
        "waferrt.estimator.train", "model_flops_per_token",
        "lambda config, seq: orig(config, seq) - 6 * config.n_layers * seq * config.dim",
        ["tests/unit/test_train_estimate.py", "tests/unit/test_pins.py"]),
    "layer_parts: a training forward without its attention": (
        "waferrt.estimator.train_layer", "layer_parts",
        "lambda spec, config, run: {k: c for k, c in orig(spec, config, run).items() if k != 'forward.attention'}",
        ["tests/unit/test_train_ties.py", "tests/unit/test_pins.py"]),
    "block_forward_parts: one residual add for free": (
        "waferrt.core.train_cost", "block_forward_parts",
        "lambda *a: (lambda p: {**p, 'residual': __import__('waferrt.core.cost', fromlist=['x']).Cost("
        "flops=p['residual'].flops // 2, cycles=p['residual'].cycles / 2)})(orig(*a))", FILES["train"]),
    "message_cycles: alpha paid twice": (
        "waferrt.core.cost", "message_cycles", "lambda spec, h, s, b: orig(spec, h, s, b) + h * spec.alpha_cycles",
        FILES["cost"] + FILES["decode"][1:2]),
    "flop_cycles: half the rate": (
        "waferrt.core.cost", "flop_cycles", "lambda spec, f, dtype='float32': 2 * orig(spec, f, dtype)",
        FILES["cost"] + FILES["decode"][1:2]),
    "allreduce_cost: one stage too few (ktree)": (
        "waferrt.core.cost", "allreduce_cost",
        "lambda spec, algo, n, nbytes, k=2: (lambda c: c if algo != 'ktree' or c.stages < 2 else "
        "__import__('dataclasses').replace(c, stages=c.stages - 1))(orig(spec, algo, n, nbytes, k))",
        FILES["cost"]),
    "on_lines: traffic of one line only": (
        "waferrt.core.cost", "on_lines", "lambda c, lines: c", FILES["cost"] + FILES["decode"][1:2]),
    "core_bytes: 4 bytes more on every core": (
        "waferrt.core.layout", "core_bytes", "lambda lay: orig(lay) + 4", FILES["decode"]),
    "layer_booking: scratch left out": (
        "waferrt.decode.layout", "layer_booking",
        "lambda *a, **kw: {k: v for k, v in orig(*a, **kw).items() if k != 'scratch'}",
        FILES["decode"] + ["tests/unit/test_estimate.py::test_closed_form_sram_is_what_the_tiles_book"]),
    "handover_bytes: half the payload": (
        "waferrt.decode.cost", "handover_bytes", "lambda config, items: orig(config, items) // 2", FILES["decode"]),
    "handover_cost: no multicast down the rows": (
        "waferrt.decode.cost", "handover_cost",
        "lambda spec, src, dst, nbytes: orig(spec, src, dst.__class__(dst.x0, dst.y0, dst.w, 1), nbytes) "
        "if src != dst else orig(spec, src, dst, nbytes)", FILES["decode"]),
    "layer_decode_parts: softmax flops left out": (
        "waferrt.decode.cost", "layer_decode_parts",
        "lambda *a, **kw: [p for p in orig(*a, **kw) if p[0] != 'softmax']", FILES["decode"]),
    "Decoding.line_reduce: K-tree with one level more": (
        "waferrt.decode.decoding", "Decoding.line_reduce",
        "lambda self, spec, axis, n, nbytes, lines: __import__('waferrt.core.cost', fromlist=['x']).on_lines("
        "__import__('waferrt.core.cost', fromlist=['x']).allreduce_cost(spec.on_line(axis, n), self.coll.algo, n, "
        "nbytes, self.coll.k + 1), lines)", FILES["decode"]),
    "token_cost: one cycle more per token": (
        "waferrt.decode.cost", "token_cost",
        "lambda spec, dec, stage, pos, want: orig(spec, dec, stage, pos, want) + "
        "__import__('waferrt.core.cost', fromlist=['x']).Cost(cycles=1.0)", FILES["decode"]),
    "stream_block_bytes: 64 bytes more": (
        "waferrt.decode.layout", "stream_block_bytes", "lambda *a, **kw: orig(*a, **kw) + 64", FILES["stream"]),
    "streamed_bytes: the head without its final norm": (
        "waferrt.decode.streaming", "streamed_bytes",
        "lambda config, kind, dtype, items: "
        "orig(config, kind, dtype, items) - (config.dim * 4 if kind is __import__('waferrt.decode.stage', "
        "fromlist=['x']).StageKind.HEAD else 0)",
        FILES["stream"]),
    "stream_step_cycles: the embedding rows for free": (
        "waferrt.decode.streaming", "stream_step_cycles",
        "lambda spec, dec, region, kv, b: orig(spec, dec, region, kv, b) - __import__("
        "'waferrt.decode.streaming', fromlist=['x']).stream_cycles(spec, b * dec.config.dim * 4)",
        FILES["stream"] + ["tests/unit/test_estimate.py::test_streaming_is_bounded_by_the_ingress"]),
    "flow schedule (schedule_seconds): 10% slower": (
        "waferrt.decode.schedule", "schedule_seconds",
        "lambda schedule: 1.1 * orig(schedule)",
        FILES["decode"]),
    "stage_handover: every hand-over free": (
        "waferrt.decode.cost", "stage_handover",
        "lambda spec, config, src, dst, items: __import__('waferrt.core.cost', fromlist=['x']).Cost()",
        FILES["decode"] + ["tests/unit/test_estimate.py::test_the_estimate_of_a_placement_is_what_the_emulator_books"]),
    "transposed_cost: partial sums as large as the moving blocks": (
        "waferrt.core.gemm_cost", "transposed_cost",
        "lambda spec, acc, moving, flops, dtype='float32', rate=None: "
        "orig(spec, __import__('dataclasses').replace(acc, values=moving.values), moving, flops, dtype, rate)",
        FILES["train"]),
    "block_backward_parts: the layout moves for free": (
        "waferrt.core.train_cost", "block_backward_parts",
        "lambda *a: {**orig(*a), 'relayout': __import__('waferrt.core.cost', fromlist=['x']).Cost()}", FILES["train"]),
    "square_tokens: the sequences not padded each": (
        "waferrt.core.train_cost", "square_tokens", "lambda shape, side: side * -(-shape.tokens // side)",
        ["tests/unit/test_sequences.py", "tests/unit/test_train_ties.py", "tests/unit/test_train_kept.py"]),
    "block_forward_parts: attention over the B*S x B*S block": (
        "waferrt.core.train_cost", "block_forward_parts",
        "lambda spec, config, shape, side, flops, dtype='float32': {**orig(spec, config, shape, side, flops, dtype), "
        "'attention': __import__('waferrt.core.gemm_cost', fromlist=['x']).attention_cost(spec, "
        "__import__('waferrt.core.gemm_cost', fromlist=['x']).AttentionShape(shape.tokens, config.head_dim, "
        "config.n_heads, side), flops['softmax'], dtype)}", FILES["train"]),
    "head_backward_parts: the chunks priced as one": (
        "waferrt.core.train_cost", "head_backward_parts",
        "lambda spec, shape, dtype='float32', chunks=1: orig(spec, shape, dtype)",
        FILES["train"] + ["tests/unit/test_head_chunks.py"]),
    "alltoall_cost: the longest route's hops left out": (
        "waferrt.core.cost", "alltoall_cost",
        "lambda spec, phase: __import__('dataclasses').replace(orig(spec, phase), "
        "cycles=orig(spec, phase).cycles - phase.hops * spec.alpha_cycles)",
        ["tests/unit/test_pins.py", "tests/unit/test_topology.py", "tests/unit/test_moe_mesh.py",
         "tests/unit/test_moe_estimate.py"]),
    "cycles_seconds: a 1 GHz clock whatever the spec": (
        "waferrt.core.cost", "cycles_seconds", "lambda spec, cycles: cycles / 1e9",
        ["tests/unit/test_pins.py", "tests/unit/test_owners.py", "tests/unit/test_estimate.py"]),
    "segment_bytes: the last segment not padded": (
        "waferrt.core.cost", "segment_bytes", "lambda nbytes, n: nbytes // n",
        FILES["cost"] + ["tests/unit/test_moe_links.py"]),
    "activation_bytes: the per-position scores left out": (
        "waferrt.decode.layout", "activation_bytes",
        "lambda config, region, tokens, head_groups=1: orig(config, region, tokens, head_groups) - 8 * "
        "(config.n_heads // head_groups) * -(-tokens // region.w)",
        FILES["stream"] + ["tests/unit/test_estimate.py"]),
    "kv_core_bytes: one request's K/V only": (
        "waferrt.decode.layout", "kv_core_bytes",
        "lambda config, region, tokens, requests, dtype='float32', head_groups=1: "
        "orig(config, region, tokens, 1, dtype, head_groups)",
        FILES["stream"] + ["tests/unit/test_estimate.py"]),
    "stream_core_bytes: a single weight buffer": (
        "waferrt.decode.layout", "stream_core_bytes",
        "lambda config, region, tokens, requests, dtype='float32', head_groups=1: "
        "orig(config, region, tokens, requests, dtype, head_groups) - __import__('waferrt.decode.layout', "
        "fromlist=['x']).stream_block_bytes(config, region, dtype, head_groups)", FILES["stream"]),
    "cheapest_routed_cycles: a quarter dearer than the cheapest routing": (
        "waferrt.decode.routed_cost", "cheapest_routed_cycles",
        "lambda spec, dec, region, batch: 1.25 * orig(spec, dec, region, batch)",
        ["tests/unit/test_moe_modelled.py", "tests/unit/test_run_bound.py"]),
    "moe_parts: the combine for free": (
        "waferrt.decode.routed_cost", "moe_parts",
        "lambda spec, dec, region, batch: [p for p in orig(spec, dec, region, batch) if p[0] != 'combine']",
        ["tests/unit/test_pins.py", "tests/unit/test_moe_mesh.py", "tests/unit/test_moe_expected.py",
         "tests/unit/test_moe_modelled.py"]),
    "routed_parts: the combine for free": (
        "waferrt.decode.routed_cost", "routed_parts",
        "lambda spec, dec, region, chosen: orig(spec, dec, region, chosen)[:2] + "
        "(__import__('waferrt.core.cost', fromlist=['x']).Cost(),)",
        ["tests/unit/test_pins.py", "tests/unit/test_moe_expected.py", "tests/unit/test_moe_mesh.py"]),
    "sparse_parts: the prediction's reduce left out": (
        "waferrt.decode.cost", "sparse_parts",
        "lambda spec, dec, region, row: [p for p in orig(spec, dec, region, row) if p[0] != 'predict.reduce']",
        ["tests/unit/test_pins.py", "tests/unit/test_sparse_decode.py", "tests/unit/test_sparse_estimate.py",
         "tests/unit/test_topk_kernel.py"]),
    "first_true: one past the answer": (
        "waferrt.core.arith", "first_true",
        "lambda lo, hi, pred: (lambda v: v if v is None or v >= hi else v + 1)(orig(lo, hi, pred))",
        ["tests/unit/test_owners.py", "tests/unit/test_pins.py",
         "tests/unit/test_sched_placement.py::test_too_small_mesh_says_bytes_needed_and_what_fits"]),
}

RUNNER = r"""
import importlib, pkgutil, sys, types
import waferrt
for m in pkgutil.walk_packages(waferrt.__path__, "waferrt."):
    if not m.name.startswith(("waferrt.actors", "waferrt.cli", "waferrt.testing", "waferrt.model.gguf",
                              "waferrt.model.tokenizer", "waferrt.runtime", "waferrt.llm", "waferrt.inject",
                              "waferrt.dsm", "waferrt.recovery", "waferrt.cli.draw",
                              "waferrt.cli.sweep_draw")):
        importlib.import_module(m.name)
def patch(module, attr, source):  # in a function: __main__'s own globals must not hold the original
    mod = importlib.import_module(module)
    if "." in attr:
        cls, name = attr.split(".")
        setattr(getattr(mod, cls), name, eval(source, {"orig": getattr(getattr(mod, cls), name)}))
        return
    orig = getattr(mod, attr)
    broken = eval(source, {"orig": orig})
    for m in list(sys.modules.values()):
        for k, v in list(vars(m).items()) if isinstance(m, types.ModuleType) else ():
            if v is orig:
                setattr(m, k, broken)


patch(*sys.argv[1:4])
import pytest
sys.exit(pytest.main(["-q", "-rf", "--no-header", "-p", "no:cacheprovider", *sys.argv[4:]]))
"""


def run(name: str) -> tuple[list[str], float, str]:
    module, attr, source, files = BREAKS[name]
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", RUNNER, module, attr, source, *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    failed = sorted(set(re.findall(r"^FAILED (\S+?)(?: - |$)", proc.stdout, re.M)))
    tail = "" if failed or proc.returncode in (0, 1) else proc.stdout[-1500:] + proc.stderr[-1500:]
    return failed, time.time() - t0, tail


def _short(test: str) -> str:
    path, _, rest = test.partition("::")
    return Path(path).stem + "::" + re.sub(r"\[.*", "[...]", rest)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="run only the breaks whose name contains one of these words")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown (for ARCHITECTURE.md)")
    args = ap.parse_args()
    names = [n for n in BREAKS if not args.only or any(w in n for w in args.only)]
    rows, gaps = [], []
    for name in names:
        failed, secs, tail = run(name)
        tests = sorted({_short(t) for t in failed})
        rows.append((name, len(failed), tests))
        print(f"{name}: {len(failed)} failing test(s) in {secs:.0f} s: {', '.join(tests[:4])}"
              + (f" and {len(tests) - 4} more" if len(tests) > 4 else ""), flush=True)
        if tail:
            print(tail, flush=True)
        if not failed:
            gaps.append(name)
    if args.markdown:
        print("\n| break (one owner, patched) | failing tests | caught by (among others) |\n| --- | ---: | --- |")
        for name, n, tests in rows:
            print(f"| {name} | {n} | {', '.join(f'`{t}`' for t in tests[:3])} |")
    print(f"\n{len(rows) - len(gaps)} of {len(rows)} breaks caught" + (f"; NOT caught: {gaps}" if gaps else ""))
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main())
