"""Encoding throughput of our TransfoXLTokenizer vs the legacy transformers 4.37.2 tokenizer (sacremoses).

Run from the repository root:

    python benchmarks/bench_tokenizer.py [--rounds 7] [--legacy-python /work/legacy-venv/bin/python]

Both tokenizers load the same legacy folder (tests/fixtures/tokenizer/legacy) and encode the parity corpus
(tests/fixtures/tokenizer/corpus.txt) to ids, through the public call `tokenizer(lines)` and one line at a time
with `tokenizer.encode(line)`. The legacy tokenizer runs in a worker process under the legacy interpreter; rounds
alternate between the two so that machine load hits both alike. Ours is timed with `tokenizers`' thread pool
(`TOKENIZERS_PARALLELISM=true`, its default) and on one thread. Prints the median lines/s and the ratios.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tokenizer"


def read_lines():
    return (FIXTURES / "corpus.txt").read_text(encoding="utf-8").split("\n")[:-1]


def timed(function, lines):
    start = time.perf_counter()
    function(lines)
    return len(lines) / (time.perf_counter() - start)


def measure(tokenizer, lines):
    """lines/s of `tokenizer(lines)` and of `tokenizer.encode(line)` per line."""
    return {
        "batch": timed(tokenizer, lines),
        "per_line": timed(lambda batch: [tokenizer.encode(line) for line in batch], lines),
    }


def legacy_worker():
    """Runs under the legacy interpreter: one measurement per line read on stdin, one JSON line back."""
    from transformers import TransfoXLTokenizer
    from transformers.utils import logging

    logging.set_verbosity_error()
    tokenizer = TransfoXLTokenizer.from_pretrained(FIXTURES / "legacy")
    lines = read_lines()
    measure(tokenizer, lines[:50])  # warm-up
    for _ in sys.stdin:
        print(json.dumps(measure(tokenizer, lines)), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--legacy-python", default="/work/legacy-venv/bin/python")
    args = parser.parse_args()

    worker = subprocess.Popen(
        [args.legacy_python, __file__, "--legacy-worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TRUST_REMOTE_CODE": "True"},  # the legacy tokenizer refuses its pickle otherwise
        text=True,
    )
    from transformers import AutoTokenizer

    import transformers_xl  # noqa: F401  (registers the tokenizer)

    ours = AutoTokenizer.from_pretrained(FIXTURES / "legacy")
    lines = read_lines()
    measure(ours, lines[:50])  # warm-up
    results = {"ours": [], "ours, 1 thread": [], "legacy": []}
    for _ in range(args.rounds):
        os.environ["TOKENIZERS_PARALLELISM"] = "true"
        results["ours"].append(measure(ours, lines))
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        results["ours, 1 thread"].append(measure(ours, lines))
        worker.stdin.write("go\n")
        worker.stdin.flush()
        results["legacy"].append(json.loads(worker.stdout.readline()))
    worker.stdin.close()
    worker.wait()

    medians = {
        name: {kind: statistics.median(round_[kind] for round_ in rounds) for kind in ("batch", "per_line")}
        for name, rounds in results.items()
    }
    print(f"{len(lines)} corpus lines, {args.rounds} interleaved rounds, median lines/s")
    print(f"{'':24s} {'tokenizer(lines)':>18s} {'encode(line)':>14s}")
    for name, kinds in medians.items():
        print(f"{name:24s} {kinds['batch']:18.0f} {kinds['per_line']:14.0f}")
    for name in ("ours", "ours, 1 thread"):
        ratios = [medians[name][kind] / medians["legacy"][kind] for kind in ("batch", "per_line")]
        print(f"{name + ' / legacy':24s} {ratios[0]:17.1f}x {ratios[1]:13.1f}x")


if __name__ == "__main__":
    if sys.argv[1:] == ["--legacy-worker"]:
        legacy_worker()
    else:
        main()
