"""New-token throughput of Transformer-XL generation: ours with the memory cache, ours recomputing the whole
sequence every step, and the legacy transformers 4.37.2 implementation, on the same weights, in one run.

    python benchmarks/bench_generation.py [--legacy-python /path/to/venv/bin/python] [--prompts 64 256 1024]

The legacy implementation needs transformers 4.37.2, which cannot share a process with transformers v5: it runs in
a worker process started with `--legacy-python` (a throw-away venv: `pip install torch==2.13.0
transformers==4.37.2`), kept warm and driven round by round, so ours and the reference alternate (A, B, A, B).
Without `--legacy-python` only our two modes are measured.

Per-token time excludes the prompt: it is (time(generate n2 tokens) - time(generate n1 tokens)) / (n2 - n1).
Greedy decoding, fp32, 2 threads, eval mode. Reports min and median over rounds and the ratios.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CONFIG = dict(  # the measurement config of shared/reference/performance-notes.md, wt103-like memory
    vocab_size=32000, cutoffs=[8000, 16000], d_model=512, d_embed=512, n_head=8, d_head=64, d_inner=2048,
    div_val=1, n_layer=6, mem_len=1600, clamp_len=1000, same_length=False, dropout=0.0, dropatt=0.0,
    tie_projs=[False, False, False], eos_token_id=None,
)  # fmt: skip


def time_new_tokens(generate, prompt, n1, n2, repeats):
    """Seconds per new token of `generate(prompt, n)`, the prompt's cost cancelled out; one value per repeat."""
    values = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate(prompt, n1)
        short = time.perf_counter() - start
        start = time.perf_counter()
        generate(prompt, n2)
        values.append((time.perf_counter() - start - short) / (n2 - n1))
    return values


def make_generate(model, use_cache, **extra):
    def run(prompt, new_tokens):
        with torch.inference_mode():
            return model.generate(
                prompt,
                **extra,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                use_cache=use_cache,
                pad_token_id=0,
            )

    return run


def legacy_worker(folder):
    """Runs under transformers 4.37.2: loads the folder, answers {"prompt_len", "n1", "n2", "repeats"} requests."""
    from transformers import TransfoXLLMHeadModel

    torch.set_num_threads(2)
    model = TransfoXLLMHeadModel.from_pretrained(folder).eval()
    generate = make_generate(model, use_cache=True)  # the legacy model takes no attention_mask
    for line in sys.stdin:
        request = json.loads(line)
        prompt = torch.randint(1, CONFIG["vocab_size"], (1, request["prompt_len"]), generator=torch.Generator().manual_seed(0))
        if request.get("tokens"):
            print(json.dumps({"tokens": generate(prompt, request["tokens"])[0].tolist()}), flush=True)
            continue
        values = time_new_tokens(generate, prompt, request["n1"], request["n2"], request["repeats"])
        print(json.dumps({"values": values}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help="python of a venv with transformers==4.37.2")
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--legacy-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.legacy_worker:
        return legacy_worker(args.legacy_worker)

    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**CONFIG)).eval()
    folder = Path(tempfile.mkdtemp(prefix="bench_txl_"))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # every key, as legacy files hold them

    legacy = None
    if args.legacy_python:
        legacy = subprocess.Popen(
            [args.legacy_python, __file__, "--legacy-worker", str(folder)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),  # keep the repo (and transformers_xl) off the worker's path
        )

    def ask_legacy(request):
        legacy.stdin.write(json.dumps(request) + "\n")
        legacy.stdin.flush()
        return json.loads(legacy.stdout.readline())

    cached = make_generate(model, True, attention_mask=None)
    recompute = make_generate(model, False, attention_mask=None)
    if legacy:  # parity first: legacy starts from zero memory vectors, so compare in that mode
        model.config.zero_initial_mems = True
        prompt = torch.randint(1, CONFIG["vocab_size"], (1, 64), generator=torch.Generator().manual_seed(0))
        same = cached(prompt, 8)[0].tolist() == ask_legacy({"prompt_len": 64, "tokens": 8})["tokens"]
        print(f"greedy tokens identical to legacy (zero_initial_mems=True): {same}")
        model.config.zero_initial_mems = False

    results = {}
    for prompt_len in args.prompts:
        prompt = torch.randint(1, CONFIG["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(0))
        cached(prompt, 2), recompute(prompt, 2)  # warm-up
        rows = {"ours (cache)": [], "ours (recompute)": [], "legacy 4.37.2": []}
        for _ in range(args.rounds):
            rows["ours (cache)"] += time_new_tokens(cached, prompt, 4, 20, 1)
            if legacy:
                rows["legacy 4.37.2"] += ask_legacy({"prompt_len": prompt_len, "n1": 4, "n2": 20, "repeats": 1})["values"]
            rows["ours (recompute)"] += time_new_tokens(recompute, prompt, 2, 4, 1)
        results[prompt_len] = {name: values for name, values in rows.items() if values}

    print(f"\nms per new token (min / median over {args.rounds} rounds), B=1, d_model 512, 6 layers, mem_len 1600")
    names = list(results[args.prompts[0]])
    print(f"{'prompt':>7} | " + " | ".join(f"{name:>18}" for name in names) + " | cache vs legacy | cache vs recompute")
    for prompt_len, rows in results.items():
        cells = [f"{min(v) * 1e3:7.1f} / {statistics.median(v) * 1e3:7.1f}" for v in rows.values()]
        ours = statistics.median(rows["ours (cache)"])
        vs_legacy = f"{statistics.median(rows['legacy 4.37.2']) / ours:14.1f}x" if "legacy 4.37.2" in rows else "-"
        vs_recompute = statistics.median(rows["ours (recompute)"]) / ours
        print(f"{prompt_len:>7} | " + " | ".join(f"{c:>18}" for c in cells) + f" | {vs_legacy:>15} | {vs_recompute:17.1f}x")
    first, last = (statistics.median(results[p]["ours (cache)"]) for p in (args.prompts[0], args.prompts[-1]))
    print(f"\nours (cache) per-token time, prompt {args.prompts[-1]} vs {args.prompts[0]}: {last / first:.2f}x")
    if legacy:
        legacy.stdin.close()
        legacy.wait()


if __name__ == "__main__":
    main()
