"""STAR's sparse attention on SmolLM2-135M: accuracy against dense beside the modelled time, per context.

For each context length N (a prompt of N tokens cut from the project's own README and docs, repeated; at
most the model's context less the steps: 8192 runs as 8,183):
the numpy ReferenceModel prefills it densely, then decodes `--steps` greedy tokens densely; each sparse
mode then decodes the same steps from the same prefilled cache, fed dense's tokens (teacher forcing: every
step compares the logits of the same history). Printed per mode: the per-step logit error (max |sparse -
dense| over the vocabulary, relative to dense's largest |logit|, mean and worst over the steps) and the
share of steps whose argmax equals dense's token. Beside it, the modelled cycles of one token's attention
in one layer region on WSE-2 (``decode.cost.attention_parts`` under each mode: the prediction and its
reduce, the top-K -- selection, streamed merge, multicast: ``decode.topk`` -- and the attention over the
kept keys) against dense, and their ratio.

    python benchmarks/sparse_attention.py [--contexts 2048,4096,8192] [--keeps 32,64,256,0.1] [--steps 8]
                                          [--sparse-prefill] [--synthetic] [--where-pays]

Every run but --synthetic's ends with the where-sparse-pays table (`--where-pays`: only it, seconds): on the
estimator's latency plans of SmolLM2-135M and Llama3-8B (K/V reserve 8,192 x 1, float16) one layer's attention per
token dense vs sparse from 2K to 4M positions by term (decode.cost.attention_parts: the scores or the prediction
with their reduce over the rows, the top-K's selection, its merge and multicast, the rest), the ratio, one
request's modelled time per token, and sparse's largest term. Sparse pays at none of them: the prediction costs the
dense Q.K^T's flops at the same 16-bit rate and its partial sums are reduced over the rows as the scores' are (the
largest term from 32K on), and the selection's comparisons cost more than the softmax and P.V it saves
(docs/decode.md, "Where sparse pays", holds the table and the reasoning). E.g. Llama3-8B sparse:64:

      context       mode |     Q.K^T     rest     dense |   predict   select  merge    rest    sparse |     x | ...
        8,192  sparse:64 |     1,442    2,004     3,446 |     1,442      600  4,446   3,446     9,934 |  0.35 | ...
    1,048,576  sparse:64 |   141,010   33,724   174,734 |   141,010   89,516  4,446   3,824   238,796 |  0.73 | ...

`--synthetic` measures the accuracy at 2K-32K (SmolLM2's context is 8K) on a model the project makes itself:
tiny_config's Llama with seeded random weights, its context widened, fed the docs' bytes -- on the numpy
reference (dense prefill, then teacher-forced decode steps per mode). Random weights attend almost uniformly,
the worst case for a top-K. A run (--keeps 32,64,256,0.1 --steps 8, a minute), a few rows:

    context         mode  err mean   err max  top-1 = dense
       2048   sparse:256    0.4812    0.5311            25%
       4096   sparse:256    0.6405    0.6824           100%
       8192   sparse:256    0.7041    0.7709            88%
      16384    sparse:64    0.7420    0.7929             0%
      16384   sparse:0.1    0.4024    0.4319           100%
      32768    sparse:64    1.0158    1.1780             0%
      32768   sparse:0.1    0.6846    0.7223           100%

A run (2-core VM under other agents' load; --contexts 2048,4096 then --contexts 8192, 8 steps, ~65 min; at 2K
and 4K sparse:256 and sparse:0.1 kept 75-100% of dense's tokens at 2.9-3.7x its modelled cycles):

    context         mode  err mean   err max  = dense |  predict     sort   attend    total    dense  ratio
       2048    sparse:32    0.1555    0.2157      62% |     3420     4286     4644    12350     8100   1.52
       2048    sparse:64    0.1110    0.1629      62% |     3420     6590     8100    18110     8100   2.24

       4096    sparse:32    0.1995    0.3764      50% |     6588     6014     4644    17246    15012   1.15
       4096    sparse:64    0.1467    0.2925      62% |     6588     8606     8100    23294    15012   1.55

       8183    sparse:32    0.0948    0.1359      75% |    12924     9470     4644    27038    28836   0.94
       8183    sparse:64    0.0682    0.0959     100% |    12924    12638     8100    33662    28836   1.17
       8183   sparse:256    0.0400    0.0699     100% |    12924    27038    28836    68798    28836   2.39
       8183   sparse:0.1    0.0206    0.0374     100% |    12924    62507    28836   104267    28836   3.62
The logit error falls with K (8K: 9.5% mean at sparse:32, 2.1% at sparse:0.1) and sparse:64 and up keep
62-100% of dense's tokens (100% at 8K); modelled on a 32x32 region (the columns re-derived since: a core
attends over up to min(K, its positions) kept keys, the busiest core's bound), sparse:32 is cheaper than dense
at 8K (0.94x) and dearer below; the top-K's selection and serialisation grow with K, so large K does not pay at
these contexts. The run's accuracy columns are unchanged by that (the reference's numbers).

Then the prefill (closed forms only, instant): one layer's 512-token chunk at the end of each context on the
32x32 square, its attention dense vs sparse (prediction: a transposed MeshGEMM over log-domain keys at the
16-bit rate; the row top-K; the softmax and P.V over the kept keys, whose score and P blocks move compact:
min(K, the key block) values a query, not the block's), e.g. (contexts 2048-32768 on SmolLM2's shape)

    context         mode |   predict      sort    attend      layer      dense  ratio
       2048    sparse:32 |    443392     60446    971896    3571094    3961208   0.90
       4096    sparse:64 |    885760    129566   1937272    5079196    5851774   0.87
       8183    sparse:32 |   1770496    143390   1186168    5274943    9618721   0.55
       8183   sparse:256 |   1770496    424478   7443832   11813695    9618721   1.23
      32768    sparse:64 |   7078912    581150   3508600   13652767   32239873   0.42

Before the score and P blocks moved compact (they moved whole, kb values a query), the same rows were 0.97,
0.97, 0.76, 1.23 and 0.68: at 8K-32K the whole blocks' moves were most of sparse's "attend". Where K is at
least a key block (sparse:256 at 8K: 256 keys a 256-key block), nothing is saved, and the prediction and the
top-K make sparse dearer than dense.

With --sparse-prefill each mode also prefills the prompt sparsely (the reference's per-row sparse prefill) and
its "prefill+decode" row compares the first logits after the prompt and the steps after it with dense's. A run
(--contexts 1024,2048 --keeps 32,64 --steps 4 --sparse-prefill, 35 min on the loaded VM): the sparse prefill
adds to the logit error (2K sparse:32: 19% mean decoding sparsely after a dense prefill, 29% with the prefill
sparse too) while every argmax stayed dense's (4 of 4, and the first token after the prompt):

    context         mode       sparse in  err mean   err max  = dense
       1024    sparse:64  prefill+decode    0.0700    0.0852     100%
       2048    sparse:32          decode    0.1888    0.3158     100%
       2048    sparse:32  prefill+decode    0.2902    0.4722     100%
       2048    sparse:64  prefill+decode    0.2194    0.3977     100%
"""

from __future__ import annotations

import argparse
import pathlib
from dataclasses import replace

import numpy as np

from waferrt.core.cost import cycles_seconds
from waferrt.core.mesh import Region
from waferrt.core.spec import WSE2
from waferrt.decode.cost import attention_parts
from waferrt.decode.decoding import Decoding
from waferrt.decode.prefill import prefill_layer_parts
from waferrt.estimator.estimate import Objective, estimate
from waferrt.model import AttentionMode, KVCache, ReferenceModel, Tokenizer, load_model, synthetic_llama, tiny_config
from waferrt.model.reference import Rope, qkv_rope, rmsnorm
from waferrt.model.zoo import model_by_name
from waferrt.scheduler import KVReserve

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXTS = ("README.md", "docs/ARCHITECTURE.md", "docs/ESTIMATES.md")
REGION = Region(0, 0, 32, 32)  # one layer region of the modelled decode: positions along its 32 columns
CHUNK = 512  # prefill this many tokens at a time (bounds the causal scores' memory)
PAYS_MODELS = ("smollm2-135m", "llama3-8b")  # the where-pays table: their latency plans on WSE-2
PAYS_CONTEXTS = tuple(2048 << i for i in range(12))  # 2K .. 4M positions
LONG_CONTEXTS = "2048,4096,8192,16384,32768"  # --synthetic's default
RESERVE = KVReserve(8192, 1)  # the plans' K/V reserve: one request of 8,192 positions


def prompt_ids(tok: Tokenizer, n: int) -> list[int]:
    """n token ids of the project's own docs, repeated as often as needed."""
    ids = tok.encode("\n\n".join((ROOT / t).read_text() for t in TEXTS))
    return (ids * (n // len(ids) + 1))[:n]


def copy_cache(cache: KVCache) -> KVCache:
    out = KVCache(cache.config, cache.capacity)
    out.k, out.v, out.length = [k.copy() for k in cache.k], [v.copy() for v in cache.v], cache.length
    return out


def decode(model: ReferenceModel, cache: KVCache, tokens: list[int]) -> np.ndarray:
    """Logits (steps, vocab) after feeding each of `tokens` in turn."""
    return np.stack([model.step(t, cache.length, cache) for t in tokens])


def prefilled(model: ReferenceModel, ids: list[int], steps: int) -> tuple[KVCache, np.ndarray]:
    """The cache after prefilling `ids` CHUNK tokens at a time (room for `steps` more), and the last logits."""
    cache = model.new_cache(capacity=len(ids) + steps + 1)
    for lo in range(0, len(ids), CHUNK):
        first = model.prefill(ids[lo:lo + CHUNK], cache)
    return cache, first


def errors(got: np.ndarray, dense: np.ndarray, tokens: list[int]) -> tuple[float, float, float]:
    """(mean, worst) logit error relative to dense's largest |logit|, and the share of argmaxes equal to tokens."""
    err = np.max(np.abs(got - dense), axis=-1) / np.max(np.abs(dense), axis=-1)  # (steps,)
    return float(np.mean(err)), float(np.max(err)), float(np.mean(np.argmax(got, axis=-1) == np.asarray(tokens)))


def accuracy(config, weights, prefill: tuple[KVCache, np.ndarray, list[int]], modes: list[AttentionMode],
             steps: int):
    """Dense's greedy tokens, then each mode's logit error and argmax agreement on the same history: decoding
    sparsely after dense's prefill ("decode"), and (with prompt ids) prefilling sparsely too ("prefill+decode":
    the first logits after the prompt are compared as well)."""
    cache, first, ids = prefill
    dense_model, tokens, logits = ReferenceModel(config, weights), [int(np.argmax(first))], []
    dense_cache = copy_cache(cache)
    for _ in range(steps):
        logits.append(dense_model.step(tokens[-1], dense_cache.length, dense_cache))
        tokens.append(int(np.argmax(logits[-1])))
    dense = np.stack(logits)  # (steps, vocab)
    rows = []
    for mode in modes:
        model = ReferenceModel(config, weights, mode)
        got = decode(model, copy_cache(cache), tokens[:-1])
        rows.append((mode, "decode", *errors(got, dense, tokens[1:])))
        if ids:
            own, own_first = prefilled(model, ids, steps)
            got = np.concatenate([own_first[None], decode(model, own, tokens[:-1])])
            rows.append((mode, "prefill+decode", *errors(got, np.concatenate([first[None], dense]), tokens)))
    return rows


def prefill_table(dec: Decoding, contexts: list[int], modes: list[AttentionMode]) -> None:
    """The modelled prefill of one layer: a CHUNK-token chunk at the end of each context (the cache holding the
    rest) on REGION's square, its attention dense vs each mode (decode.prefill.prefill_layer_parts)."""
    print(f"\nprefill: one layer's {CHUNK}-token chunk at the end of the context on a {REGION.w}x{REGION.h} square, "
          "WSE-2 cycles (the GEMMs, element-wise work and layout moves are the same either way)")
    print(f"{'context':>7} {'mode':>12} | {'predict':>9} {'sort':>9} {'attend':>9} {'layer':>10} {'dense':>10} "
          f"{'ratio':>6}")
    for n in contexts:
        dense = sum(c.cycles for _, _, c in prefill_layer_parts(WSE2, dec, REGION, min(CHUNK, n), n))
        for mode in modes:
            parts = prefill_layer_parts(WSE2, replace(dec, attention=mode), REGION, min(CHUNK, n), n)
            cyc = modelled({name: c for name, cat, c in parts if cat == "attention"})
            total = sum(c.cycles for _, _, c in parts)
            print(f"{n:>7} {str(mode):>12} | {cyc['predict']:>9.0f} {cyc['sort']:>9.0f} {cyc['attend']:>9.0f} "
                  f"{total:>10.0f} {dense:>10.0f} {total / dense:>6.2f}")


def terms(parts: dict) -> dict[str, float]:
    """Cycles of a layer's attention for one token by term: "qk" the dense scores (or sparse's prediction) with
    their reduce over the rows, the top-K's selection, its merge and multicast, and the rest (softmax, P.V and
    their reduces; sparse: with the kept keys' scores)."""
    qk = "predict" if "predict" in parts else "scores"
    out = {"qk": 0.0, "select": 0.0, "merge": 0.0, "rest": 0.0}
    for name, c in parts.items():
        key = ("qk" if name in (qk, qk + ".reduce") else "select" if name == "topk.select"
               else "merge" if name in ("topk.merge", "broadcast") else "rest")
        out[key] += c.cycles
    return out


def where_pays(modes: list[AttentionMode]) -> None:
    """Dense vs sparse per context on each PAYS_MODELS' latency plan (the estimator's, RESERVE): one layer's
    attention for one token by term (decode.cost.attention_parts), its ratio, and one request's modelled time
    per token with every layer's attention at that context (the plan's own time at RESERVE, the attention's
    difference added); past RESERVE the K/V would not fit the plan: what its region would do if it did."""
    print("where sparse pays: one layer's attention per token on the latency plan's layer region, WSE-2 cycles; "
          "Q.K^T = the scores (dense) or the add-only prediction (sparse) with its partial sums' reduce over "
          "the rows; rest = softmax and P.V (sparse: over the kept keys, with their kept scores)")
    print(f"{'context':>9} {'mode':>10} | {'Q.K^T':>9} {'rest':>8} {'dense':>9} | {'predict':>9} {'select':>8} "
          f"{'merge':>6} {'rest':>7} {'sparse':>9} | {'x':>5} | {'us/tok dense':>12} {'sparse':>8} | largest term")
    for name in PAYS_MODELS:
        config, _ = model_by_name(name)
        est = estimate(config, WSE2, WSE2.full_mesh, RESERVE, "float16", Objective("latency"))
        print(f"{name}: {config.n_layers} layers, a layer region of {est.shape.region().w}x{est.shape.region().h} "
              f"cores ({est.shape.head_groups} head groups), float16")
        for mode in modes:
            for n in PAYS_CONTEXTS:
                print(pays_line(est, mode, n))


def pays_line(est, mode: AttentionMode, n: int) -> str:
    """One row of `where_pays`: est's layer region at n positions, dense vs `mode`."""
    dec, region = Decoding(est.config, est.dtype, head_groups=est.shape.head_groups), est.shape.region()
    base = sum(c.cycles for c in attention_parts(WSE2, dec, region, RESERVE.tokens).values())
    dense, sparse = (attention_parts(WSE2, d, region, n) for d in (dec, replace(dec, attention=mode)))
    (d, s), big = (terms(dense), terms(sparse)), max(sparse.items(), key=lambda kv: kv[1].cycles)
    dt, st = sum(d.values()), sum(s.values())
    dus, sus = ((est.time_per_token_s + cycles_seconds(WSE2, est.config.n_layers * (c - base))) * 1e6 for c in (dt, st))
    return (f"{n:>9,} {str(mode):>10} | {d['qk']:>9,.0f} {d['rest']:>8,.0f} {dt:>9,.0f} | {s['qk']:>9,.0f} "
            f"{s['select']:>8,.0f} {s['merge']:>6,.0f} {s['rest']:>7,.0f} {st:>9,.0f} | {dt / st:>5.2f} | "
            f"{dus:>12,.1f} {sus:>8,.1f} | {big[0]} {big[1].cycles / st:.0%}")


def one_layer_prefilled(model: ReferenceModel, ids: list[int], steps: int) -> tuple[KVCache, np.ndarray]:
    """`prefilled` for a one-layer model without its quadratic attention: the layer's K/V depend only on the
    normed embeddings (reference.qkv_rope, RoPE'd at their positions), so they fill the cache directly; then
    the last id is stepped densely for the logits after the prompt. `synthetic_accuracy` checks it against
    `prefilled` every run."""
    config, lw, n = model.config, model.weights.layers[0], len(ids) - 1
    if config.n_layers != 1:
        raise ValueError(f"one_layer_prefilled fills a one-layer model's cache, not {config.n_layers} layers'")
    cache, rope = model.new_cache(capacity=len(ids) + steps + 1), Rope.at(np.arange(n), config)
    h = rmsnorm(model.weights.embed[np.asarray(ids[:n])], lw.attn_norm, config.norm_eps)
    _, k, v = qkv_rope(h, lw, config, rope.cos[:, None], rope.sin[:, None])  # (n, n_kv, hd) each
    cache.k[0][:, :n], cache.v[0][:, :n], cache.length = k.transpose(1, 0, 2), v.transpose(1, 0, 2), n
    return cache, model.step(ids[-1], n, cache)


def synthetic_accuracy(contexts: list[int], modes: list[AttentionMode], steps: int) -> None:
    """Accuracy at long contexts on a model the project makes itself: tiny_config's Llama cut to one layer (4
    query heads of 16 dims over 2 K/V heads) with seeded random weights (model.synthetic_llama), its context
    widened, fed the project's docs as bytes (its vocabulary is 256) -- on the numpy reference: a dense prefill
    (`one_layer_prefilled`: the quadratic prefill of 32K tokens takes hours on the loaded VM), then `steps`
    teacher-forced decode steps per mode (`accuracy`)."""
    config = replace(tiny_config(), n_layers=1, max_seq_len=max(contexts) + steps + 1)
    weights, text = synthetic_llama(config, seed=0), "\n\n".join((ROOT / t).read_text() for t in TEXTS).encode()
    ids = list((text * (max(contexts) // len(text) + 1))[:max(contexts)])
    model = ReferenceModel(config, weights)
    (a, first_a), (b, first_b) = (fill(model, ids[:300], steps) for fill in (prefilled, one_layer_prefilled))
    if not (np.allclose(first_a, first_b, atol=1e-4) and np.allclose(a.k[0][:, :299], b.k[0][:, :299], atol=1e-5)):
        raise AssertionError("one_layer_prefilled differs from the reference's own prefill at 300 tokens")
    print(f"synthetic one-layer Llama (seeded random weights, vocabulary 256: the docs' bytes), numpy reference, "
          f"{steps} teacher-forced decode steps per mode")
    print(f"{'context':>7} {'mode':>12} {'err mean':>9} {'err max':>9} {'top-1 = dense':>14}")
    for n in contexts:
        cache, first = one_layer_prefilled(model, ids[:n], steps)
        for mode, _, err_mean, err_max, agree in accuracy(config, weights, (cache, first, []), modes, steps):
            print(f"{n:>7} {str(mode):>12} {err_mean:>9.4f} {err_max:>9.4f} {agree:>14.0%}", flush=True)


def smollm2_accuracy(args, modes: list[AttentionMode]) -> None:
    """SmolLM2-135M's accuracy beside the 32x32 region's modelled cycles per context, then the prefill table."""
    config, weights, meta = load_model()
    tok, dec = Tokenizer(meta), Decoding(config)
    print(f"SmolLM2-135M, {args.steps} teacher-forced decode steps per mode; modelled: one token's attention in "
          f"one {REGION.w}x{REGION.h} layer region on WSE-2, cycles")
    print(f"{'context':>7} {'mode':>12} {'sparse in':>15} {'err mean':>9} {'err max':>9} {'= dense':>8} | "
          f"{'predict':>8} {'sort':>8} {'attend':>8} {'total':>8} {'dense':>8} {'ratio':>6}")
    contexts = [min(int(c), config.max_seq_len - args.steps - 1) for c in args.contexts.split(",")]  # 8K: 8,183
    for n in contexts:
        ids = prompt_ids(tok, n)
        cache, first = prefilled(ReferenceModel(config, weights), ids, args.steps)
        dense_cycles = sum(c.cycles for c in attention_parts(WSE2, dec, REGION, n).values())
        prefill = (cache, first, ids if args.sparse_prefill else [])
        for mode, where, err_mean, err_max, agree in accuracy(config, weights, prefill, modes, args.steps):
            cyc = modelled(attention_parts(WSE2, replace(dec, attention=mode), REGION, n))
            total = sum(cyc.values())
            print(f"{n:>7} {str(mode):>12} {where:>15} {err_mean:>9.4f} {err_max:>9.4f} {agree:>8.0%} | "
                  f"{cyc['predict']:>8.0f} {cyc['sort']:>8.0f} {cyc['attend']:>8.0f} "
                  f"{total:>8.0f} {dense_cycles:>8.0f} {total / dense_cycles:>6.2f}")
    prefill_table(dec, contexts, modes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", default=None, help="prompt lengths in tokens, comma-separated (2048,4096,8192; "
                    f"--synthetic: {LONG_CONTEXTS})")
    ap.add_argument("--keeps", default="32,64,256,0.1", help="K per query head, or fractions (32,64,256,0.1)")
    ap.add_argument("--steps", type=int, default=8, help="decode steps compared per mode (8)")
    ap.add_argument("--sparse-prefill", action="store_true", help="also prefill each prompt sparsely and compare "
                    "prefill+decode with dense (the reference's sparse prefill attends row by row: slow)")
    ap.add_argument("--synthetic", action="store_true", help="only the accuracy on the project's synthetic "
                    "one-layer Llama (contexts up to 32K) instead of SmolLM2's")
    ap.add_argument("--where-pays", action="store_true", help="only the where-sparse-pays table (seconds)")
    args = ap.parse_args()
    modes = [AttentionMode.parse(f"sparse:{k}") for k in args.keeps.split(",")]
    if args.synthetic:
        synthetic_accuracy([int(c) for c in (args.contexts or LONG_CONTEXTS).split(",")], modes, args.steps)
        return
    if not args.where_pays:
        args.contexts = args.contexts or "2048,4096,8192"
        smollm2_accuracy(args, modes)
    where_pays(modes)


def modelled(parts: dict) -> dict[str, float]:
    """Cycles of the prediction (and its reduce), the top-K (select, merge, multicast) and the attention."""
    out = {"predict": 0.0, "sort": 0.0, "attend": 0.0}
    for name, c in parts.items():
        key = "predict" if name.startswith("predict") else "sort" if name.startswith(("topk", "broadcast")) \
            else "attend"
        out[key] += c.cycles
    return out

if __name__ == "__main__":
    main()
