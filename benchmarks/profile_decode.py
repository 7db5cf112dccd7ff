"""Where a decode step's wall time goes, per tile: py-spy samples of every tile actor while the wafer decodes.

Starts the wafer (the planner's placement unless --mesh/--tile), warms it up, then decodes R requests x T
new tokens while ``py-spy record --native --idle --threads`` samples every tile process, and reads each
CPU time (and its zmq threads') from /proc around the run. Each sample of a tile's decode thread is put in ONE
category (`category`: a wait, BLAS, else by the innermost frame of ours); the table gives each category's
share of the decode thread's wall time, per tile, and the tile process's CPU seconds, of which zmq's I/O
threads' (they do the CURVE encryption and the socket work). Needs py-spy (pip install
py-spy) and ptrace rights over the tiles (root, or kernel.yama.ptrace_scope=0).

    python benchmarks/profile_decode.py [--tokens 48] [--requests 8] [--rate 50] [--top N] [--mesh WxH --tile TWxTH]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAY_worker_niceness", "0")  # as benchmarks/decode.py

import argparse  # noqa: E402
import collections  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from decode import PROMPTS, wxh  # noqa: E402

from waferrt.actors.tile import Tile  # noqa: E402
from waferrt.cli.placing import local_tiles  # noqa: E402
from waferrt.core.mesh import MeshSpec  # noqa: E402
from waferrt.core.spec import WSE2  # noqa: E402
from waferrt.llm import WaferLLM  # noqa: E402
from waferrt.model import Sampler, Tokenizer, load_model  # noqa: E402
from waferrt.scheduler import KVReserve, default_mesh, plan  # noqa: E402
from waferrt.serving import GenRequest  # noqa: E402

WAITS = ("poll (libc", "epoll_wait", "select (libc", "nanosleep", "pthread_cond_wait", "pthread_cond_timedwait",
         "sem_wait", "sem_timedwait", "__futex")
# categories by the innermost frame of ours (a file, and optionally function names, under waferrt/ or actors/)
OURS = [
    ("fabric: send/recv (zmq, msgpack, crc)", "actors/fabric.py", ()),
    ("K/V insert and shift", "decode/kvcache.py", ()),
    ("K/V insert and shift", "decode/kv_layouts.py", ("take", "reset")),
    ("cost booking (ledger, closed forms)", "core/ledger.py", ()),
    ("cost booking (ledger, closed forms)", "core/cost.py", ()),
    ("cost booking (ledger, closed forms)", "decode/cost.py", ()),
    ("cost booking (ledger, closed forms)", "decode/schedule.py", ()),
    ("cost booking (ledger, closed forms)", "decode/program.py", ("_items", "alone_cycles")),
    ("cost booking (ledger, closed forms)", "fabric/comm.py", ("book_", "_cost")),
    ("collectives' sums (fast path)", "fabric/comm.py", ()),
    ("re-cutting activations (Chunks)", "core/layout.py", ("split", "join")),
]
NAMES = ["wait for a micro-batch", "matmul (BLAS)", *dict.fromkeys(n for n, _, _ in OURS),
         "other numpy (element-wise, copies)",
         "Python (interpreter, the loop)"]


def category(stack: list[str]) -> str:
    """The category of one sample of the decode thread (`stack`: its frames, outermost first)."""
    leaf = stack[-1] if stack else ""
    if any(w in leaf for w in WAITS) or any("_pull_until" in f for f in stack[-4:]) and "libc" in leaf:
        return NAMES[0]
    if any("openblas" in f for f in stack):
        return NAMES[1]
    ours = [f for f in stack if "waferrt/" in f or "actors/" in f]
    for name, path, functions in OURS:
        if ours and path in ours[-1] and (not functions or any(fn in ours[-1] for fn in functions)):
            return name
    return NAMES[-2] if "numpy" in leaf or "libc" in leaf else NAMES[-1]


def cpu_seconds(pid: int) -> tuple[float, float]:
    """CPU seconds of a process (ended threads included) and of its zmq I/O threads (named ZMQbg/...)."""
    tick = os.sysconf("SC_CLK_TCK")

    def stat(path: str) -> tuple[str, float]:
        with open(path) as f:
            text = f.read()
        fields = text[text.rindex(")") + 2:].split()
        return text[text.index("(") + 1: text.rindex(")")], (int(fields[11]) + int(fields[12])) / tick

    zmq = 0.0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, sec = stat(f"/proc/{pid}/task/{tid}/stat")
        except FileNotFoundError:  # ended meanwhile
            continue
        zmq += sec if name.startswith("ZMQbg") else 0.0
    return stat(f"/proc/{pid}/stat")[1], zmq


def read_raw(path: str, thread: str = "decode") -> tuple[int, collections.Counter, collections.Counter]:
    """py-spy raw (collapsed) stacks of the thread named `thread` -> (its id, Counter(category: samples),
    Counter((category, innermost waferrt/actors frame): samples))."""
    per, where, tid = collections.Counter(), collections.Counter(), 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            head, *frames = stack.split(";")
            if not head.endswith(f": {thread}"):
                continue
            tid, cat = int(head.split("(")[1].split(")")[0]), category(frames)
            per[cat] += int(count)
            ours = [f for f in frames if "waferrt/" in f or "actors/" in f]
            where[cat, ours[-1] if ours else "?"] += int(count)
    return tid, per, where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rate", type=int, default=50, help="py-spy samples per second (50)")
    ap.add_argument("--top", type=int, default=0, help="also list the N frames of ours with the most samples")
    ap.add_argument("--mesh", type=wxh)
    ap.add_argument("--tile", type=wxh)
    args = ap.parse_args()
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    config, weights, meta = load_model()
    tok = Tokenizer(meta)
    reqs = [GenRequest(tuple(tok.encode(PROMPTS[i % len(PROMPTS)])), args.tokens) for i in range(args.requests)]
    kv = KVReserve(512, args.requests)
    mesh = MeshSpec(*args.mesh, *args.tile) if args.mesh else \
        default_mesh(config, WSE2, kv).in_tiles(local_tiles())  # as `waferrt generate` runs it
    tmp = tempfile.mkdtemp(prefix="waferrt-profile-")
    with WaferLLM(config, weights, plan(config, WSE2, mesh, kv=kv)) as llm:
        llm.generate(reqs, Sampler())  # warm-up
        pids = dict(zip(llm.wafer.tiles, llm.wafer.on_every_tile(Tile.pid), strict=True))
        cpu0 = {t: cpu_seconds(p) for t, p in pids.items()}
        spies = {t: subprocess.Popen([spy, "record", "--pid", str(p), "--native", "--idle", "--threads",
                                      "--rate", str(args.rate), "--format", "raw", "-o", f"{tmp}/{p}.txt"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for t, p in pids.items()}
        _, stats = llm.generate(reqs, Sampler())
        for s in spies.values():
            s.send_signal(signal.SIGINT)
        for s in spies.values():
            s.wait(60)
        cpu1 = {t: cpu_seconds(p) for t, p in pids.items()}
    print(f"{mesh}; {stats.tokens} tokens in {stats.wall_s:.1f} s ({stats.tokens / stats.wall_s:.1f} tok/s)")
    _table(pids, tmp, cpu0, cpu1, stats.wall_s, args.top)


def _table(pids, tmp, cpu0, cpu1, wall, top: int = 0) -> None:
    tiles = list(pids)
    got = {t: read_raw(f"{tmp}/{pids[t]}.txt") for t in tiles}
    print("\nshare of each tile's decode-thread wall time (py-spy samples), and CPU seconds of its threads\n")
    print("| category | " + " | ".join(str(t) for t in tiles) + " |\n| --- " * 1 + "| --- " * len(tiles) + "|")
    for name in NAMES:
        print(f"| {name} | " + " | ".join(f"{100 * got[t][1][name] / (sum(got[t][1].values()) or 1):.0f}%"
                                       for t in tiles) + " |")
    rows = {"tile process CPU s": [], "of which zmq's I/O threads (CURVE, sockets)": []}
    for t in tiles:
        rows["tile process CPU s"].append(cpu1[t][0] - cpu0[t][0])
        rows["of which zmq's I/O threads (CURVE, sockets)"].append(cpu1[t][1] - cpu0[t][1])
    for key, vs in rows.items():
        print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in vs) + " |")
    print(f"\n(wall time of the run: {wall:.1f} s; raw stacks in {tmp})")
    if top:
        every = sum((w for _, _, w in got.values()), collections.Counter())
        total = sum(every.values())
        print(f"\nthe {top} (category, innermost frame of ours) with the most samples, all tiles:")
        for (cat, frame), n in every.most_common(top):
            print(f"  {100 * n / total:5.1f}%  {cat:36s} {frame}")


if __name__ == "__main__":
    main()
