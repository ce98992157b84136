"""Encoding throughput of our TransfoXLTokenizer vs the legacy transformers 4.37.2 tokenizer (sacremoses).

Run from the repository root:

    python benchmarks/bench_tokenizer.py [--rounds 7] [--legacy-python PATH/TO/legacy-venv/bin/python]

Both tokenizers load the same legacy folder (tests/fixtures/tokenizer/legacy) and encode the parity corpus
(tests/fixtures/tokenizer/corpus.txt) to ids, through the public call `tokenizer(lines)` and one line at a time
with `tokenizer.encode(line)`. The legacy tokenizer runs in a worker process under the legacy venv's python
(`--legacy-python`, or $TRANSFORMERS_XL_LEGACY_PYTHON; docs/benchmarks.md says how to make that venv; without it
only ours is measured); rounds alternate between the two so that machine load hits both alike. Ours is timed with `tokenizers`' thread pool
(`TOKENIZERS_PARALLELISM=true`, its default) and on one thread. Prints the median lines/s and the ratios.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from timing import LEGACY_PYTHON_ENV, Worker, alternate, legacy_python, serve

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
    serve(lambda request: measure(tokenizer, lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--legacy-python", help=f"python of a transformers==4.37.2 venv (default: ${LEGACY_PYTHON_ENV})")
    args = parser.parse_args()
    python = legacy_python(args.legacy_python)
    # The legacy tokenizer refuses its own pickle without TRUST_REMOTE_CODE.
    worker = Worker(python, __file__, "--legacy-worker", env={"TRUST_REMOTE_CODE": "True"}) if python else None
    from transformers import AutoTokenizer

    import transformers_xl  # noqa: F401  (registers the tokenizer)

    ours = AutoTokenizer.from_pretrained(FIXTURES / "legacy")
    lines = read_lines()
    measure(ours, lines[:50])  # warm-up

    def ours_on(parallelism):
        os.environ["TOKENIZERS_PARALLELISM"] = parallelism
        return measure(ours, lines)

    runs = {"ours": lambda: ours_on("true"), "ours, 1 thread": lambda: ours_on("false")}
    if worker:
        runs["legacy"] = lambda: worker.ask({})
    results = alternate(runs, args.rounds, warmup=0)
    if worker:
        worker.close()

    medians = {
        name: {kind: statistics.median(round_[kind] for round_ in rounds) for kind in ("batch", "per_line")}
        for name, rounds in results.items()
    }
    print(f"{len(lines)} corpus lines, {args.rounds} interleaved rounds, median lines/s")
    print(f"{'':24s} {'tokenizer(lines)':>18s} {'encode(line)':>14s}")
    for name, kinds in medians.items():
        print(f"{name:24s} {kinds['batch']:18.0f} {kinds['per_line']:14.0f}")
    if not worker:
        print("legacy: not measured (no --legacy-python)")
        return
    for name in ("ours", "ours, 1 thread"):
        ratios = [medians[name][kind] / medians["legacy"][kind] for kind in ("batch", "per_line")]
        print(f"{name + ' / legacy':24s} {ratios[0]:17.1f}x {ratios[1]:13.1f}x")


if __name__ == "__main__":
    if sys.argv[1:] == ["--legacy-worker"]:
        legacy_worker()
    else:
        main()
