"""The corpus path of `transformers-xl train` at WikiText-103 size: vocabulary build time, encoding time and peak
memory on a synthetic corpus (not a test: the numbers depend on the machine).

    python benchmarks/bench_corpus.py                      # 103 M words (~540 MB), as wiki.train.tokens
    python benchmarks/bench_corpus.py --words 5000000      # a smaller corpus for a busy machine

The corpus: lines of 1 to 180 words (mean ~90, WikiText's paragraphs) with blank lines between paragraphs, words
drawn from a Zipf distribution over 267,735 distinct words (wt103's vocabulary size). It is written first (untimed),
then a fresh process counts the vocabulary (`corpus.count_vocabulary`, the original `Vocab` rules) and encodes the
file (`corpus.encode_file`: `tokenizers` batch encoding), and reports both times, words per second and its peak
resident memory. Targets (issue 21): peak below 8 GiB, encoding at least 1 M words/s on 2 cores.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VOCABULARY = 267_735


def write_corpus(path: Path, words: int, seed: int = 0):
    """Zipf-distributed words in WikiText-like lines, written in chunks (bounded memory)."""
    rng = np.random.default_rng(seed)
    names = np.array([f"w{i}" for i in range(VOCABULARY)], dtype=object)
    written = 0
    with open(path, "w", encoding="utf-8") as file:
        while written < words:
            lengths = rng.integers(1, 181, size=10_000)
            ids = (rng.zipf(1.1, size=int(lengths.sum())) - 1) % VOCABULARY
            tokens = names[ids]
            lines, start = [], 0
            for length in lengths:
                lines.append(" " + " ".join(tokens[start : start + length]) + " \n\n")
                start += length
            file.write("".join(lines))
            written += int(lengths.sum())
    return written


def measure(path: str) -> dict:
    """In a fresh process: count, encode, peak memory."""
    from transformers_xl.training.corpus import count_vocabulary, encode_file

    start, cpu = time.perf_counter(), time.process_time()
    symbols = count_vocabulary([path], ("<eos>",))
    symbols.append("<unk>")
    counted, counted_cpu = time.perf_counter() - start, time.process_time() - cpu
    start, cpu = time.perf_counter(), time.process_time()
    encoded = encode_file(path, {s: i for i, s in enumerate(symbols)}, "eos", "<unk>")
    encoding, encoding_cpu = time.perf_counter() - start, time.process_time() - cpu
    return {
        "vocabulary_cpu_seconds": counted_cpu,  # (CPU time of all threads: on a busy machine, what the work costs)
        "encoding_cpu_seconds": encoding_cpu,
        "words": encoded.words,
        "ids": len(encoded.ids),
        "vocabulary": len(symbols),
        "vocabulary_seconds": counted,
        "encoding_seconds": encoding,
        "vocabulary_words_per_second": encoded.words / counted,
        "encoding_words_per_second": encoded.words / encoding,
        "peak_resident_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "cpus": os.cpu_count(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--words", type=int, default=103_000_000, help="corpus size in words (default: 103 M)")
    parser.add_argument("--corpus", help="an existing text file to measure instead of a synthetic one")
    parser.add_argument("--output", help="also write the results to this JSON file")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_corpus_") as folder:
        path = args.corpus or str(Path(folder) / "train.txt")
        if not args.corpus:
            print(f"writing a synthetic corpus of {args.words:,} words ...", file=sys.stderr)
            write_corpus(Path(path), args.words)
        done = subprocess.run([sys.executable, __file__, "--measure", path], stdout=subprocess.PIPE, text=True,
                              check=True)  # fmt: skip
        results = json.loads(done.stdout.strip().splitlines()[-1]) | {"file_bytes": os.path.getsize(path)}
    print(f"{results['words']:,} words ({results['file_bytes'] / 1e6:,.0f} MB), vocabulary {results['vocabulary']:,}")
    print(f"vocabulary: {results['vocabulary_seconds']:.1f} s ({results['vocabulary_words_per_second'] / 1e6:.2f} M "
          f"words/s); encoding: {results['encoding_seconds']:.1f} s ({results['encoding_words_per_second'] / 1e6:.2f} "
          f"M words/s); peak resident memory {results['peak_resident_bytes'] / 2**30:.2f} GiB")  # fmt: skip
    print(f"CPU time (all threads): vocabulary {results['vocabulary_cpu_seconds']:.1f} s, encoding "
          f"{results['encoding_cpu_seconds']:.1f} s")  # fmt: skip
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
