"""Start-up time of the main job: the embedded default model (SmolLM2 GGUF) from a fresh
process to its first generated text, the way ``octavo generate`` runs it, and the GGUF header
parse against its peer, the ``gguf`` package's reader, on the same file in the same run.

    python benchmarks/startup.py [--repeat 3] [--baseline DIR] [--json-out F]

Each repeat is a fresh ``python`` process (imports and the file's pages as a user's second
run finds them: the tokenizer cache warm, the file in the page cache). Figures are medians:
wall seconds for ``import octavo``, ``LLM()``, the first ``generate`` (16 tokens), the
whole process; and milliseconds to parse the default model's GGUF header with
``octavo.model_loader.gguf_reader`` and with ``gguf.GGUFReader``. ``--baseline DIR``: a
checkout of another commit (``git worktree add DIR COMMIT``) whose start-up runs alternately
with this tree's, the peer for a before / after figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The checkout after PYTHONPATH's entries: a tree given there (a `git archive` export, for
# an A/B) is the octavo imported; before the installed packages.
sys.path.insert(1 + len([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import device_info, git_commit, print_json_result  # noqa: E402

_CHILD = r"""
import json, time
t0 = time.perf_counter()
import octavo
from octavo import LLM, SamplingParams
t1 = time.perf_counter()
print("TREE", octavo.__file__)
llm = LLM()
t2 = time.perf_counter()
out = llm.generate(["Write a haiku about paging."],
                   SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
t3 = time.perf_counter()
assert out[0].outputs[0].text
print("RESULT", json.dumps({"import_s": t1 - t0, "llm_s": t2 - t1, "generate_s": t3 - t2}))
"""

_PARSE = r"""
import json, sys, time
from octavo.default_model import default_model_path
path = default_model_path()
if sys.argv[1] == "octavo":
    from octavo.model_loader.gguf_reader import GGUFReader as Reader
else:
    from gguf import GGUFReader as Reader
t0 = time.perf_counter()
Reader(path)
print("RESULT", json.dumps({"parse_ms": 1e3 * (time.perf_counter() - t0)}))
"""


def _child(code: str, *args: str, tree: str | None = None) -> tuple[dict, float]:
    env = dict(os.environ)
    cwd = None
    if tree is not None:  # import octavo from that checkout (`-c` puts the cwd first)
        cwd = env["PYTHONPATH"] = os.path.abspath(tree)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          check=False, env=env, cwd=cwd)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    result = json.loads(next(x for x in lines if x.startswith("RESULT "))[len("RESULT "):])
    tree_line = [x[len("TREE "):] for x in lines if x.startswith("TREE ")]
    if tree_line:  # which checkout's octavo the child ran
        result["octavo_file"] = tree_line[0]
    return result, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default=None, help="a checkout of the commit to compare")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here} | ({"baseline": args.baseline} if args.baseline else {})
    for tree in trees.values():  # warm: the tokenizer cache and the page cache
        _child(_CHILD, tree=tree)
    samples: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeat):  # alternated, so load drifts hit both alike
        for name, tree in trees.items():
            phases, wall = _child(_CHILD, tree=tree)
            samples[name].append({**phases, "process_s": wall})
    runs = samples["this"]
    parse = {name: [_child(_PARSE, name)[0]["parse_ms"] for _ in range(args.repeat)]
             for name in ("octavo", "gguf")}
    times = [k for k in runs[0] if k.endswith("_s")]
    med = {k: statistics.median(r[k] for r in runs) for k in times}
    result = {
        "benchmark": "startup (default model, octavo generate's path)",
        "device": device_info(), "commit": git_commit(), "date": time.strftime("%Y-%m-%d"),
        "median": med, "runs": runs,
        "baseline": None if not args.baseline else {
            "tree": args.baseline,
            "median": {k: statistics.median(r[k] for r in samples["baseline"])
                       for k in times},
            "runs": samples["baseline"]},
        "gguf_header_parse_ms": {k: statistics.median(v) for k, v in parse.items()},
        "gguf_header_parse_samples_ms": parse,
    }
    print(f"import octavo {med['import_s']:.2f} s, LLM() {med['llm_s']:.2f} s, first "
          f"generate {med['generate_s']:.2f} s, whole process {med['process_s']:.2f} s")
    if args.baseline:
        b = result["baseline"]["median"]
        print(f"baseline: import octavo {b['import_s']:.2f} s, LLM() {b['llm_s']:.2f} s, first "
              f"generate {b['generate_s']:.2f} s, whole process {b['process_s']:.2f} s")
    p = result["gguf_header_parse_ms"]
    print(f"GGUF header parse: octavo {p['octavo']:.1f} ms, gguf.GGUFReader {p['gguf']:.1f} ms "
          f"({p['gguf'] / p['octavo']:.0f}x)")
    print_json_result(result, args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
