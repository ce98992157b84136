"""New-token throughput of generation, ours against the references on the same weights, in one run.

Transformer-XL: ours with the memory cache, ours recomputing the whole sequence every step, and the legacy
transformers 4.37.2 implementation. XLNet: ours and transformers' XLNet (v5), both with `use_mems=True` (the
dummy-token scheme; memory kept whole, as the Hub configs' `mem_len: null` says).

    python benchmarks/bench_generation.py [--legacy-python /path/to/venv/bin/python] [--prompts 64 256 1024]

The legacy implementation needs transformers 4.37.2, which cannot share a process with transformers v5: it runs in
a worker process started with `--legacy-python` (a throw-away venv: `pip install torch==2.13.0
transformers==4.37.2`), kept warm and driven round by round, so ours and the reference alternate (A, B, A, B).
Without `--legacy-python` only our two modes are measured.

Per-token time excludes the prompt: a logits processor timestamps every decoding step, and a run's time per token
is the median interval between consecutive steps after the first (the prompt's). Greedy decoding, fp32, 2 threads,
eval mode. Reports min and median over rounds and the ratios.
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
XLNET_CONFIG = dict(vocab_size=32000, d_model=512, n_head=8, d_inner=2048, n_layer=6, dropout=0.0, mem_len=None)


class StepClock:
    """A logits processor that only records when each decoding step reaches it."""

    def __init__(self):
        self.times = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def seconds_per_token(generate, prompt, new_tokens):
    """Median seconds between consecutive decoding steps, the prompt's step excluded."""
    clock = StepClock()
    generate(prompt, new_tokens, clock)
    intervals = [b - a for a, b in zip(clock.times[:-1], clock.times[1:])]
    return statistics.median(intervals)


def make_generate(model, use_cache, **extra):
    def run(prompt, new_tokens, clock=None):
        from transformers import LogitsProcessorList

        with torch.inference_mode():
            return model.generate(
                prompt,
                **extra,
                logits_processor=LogitsProcessorList([clock] if clock else []),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                use_cache=use_cache,
                pad_token_id=0,
            )

    return run


def print_table(title, results, baseline):
    """Rows per prompt length: min / median ms per token for each implementation, then the speed-ups."""
    print(f"\n{title}: ms per new token (min / median over rounds), B=1")
    names = list(next(iter(results.values())))
    others = [name for name in names if name != baseline]
    header = " | ".join(f"{name:>18}" for name in names) + "".join(f" | {baseline} vs {o}" for o in others)
    print(f"{'prompt':>7} | {header}")
    for prompt_len, rows in results.items():
        cells = " | ".join(f"{min(v) * 1e3:7.1f} / {statistics.median(v) * 1e3:7.1f}" for v in rows.values())
        ours = statistics.median(rows[baseline])
        ratios = "".join(
            f" | {statistics.median(rows[o]) / ours:>{len(baseline) + len(o) + 3}.1f}x" for o in others
        )
        print(f"{prompt_len:>7} | {cells}{ratios}")
    first, last = (statistics.median(rows[baseline]) for rows in (results[min(results)], results[max(results)]))
    print(f"{baseline} per-token time, prompt {max(results)} vs {min(results)}: {last / first:.2f}x")


def bench_xlnet(prompts, rounds):
    """Ours vs transformers' XLNet (same weights, same process, alternating)."""
    import transformers

    from transformers_xl.modeling.configuration_xlnet import XLNetConfig
    from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel

    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**XLNET_CONFIG)).eval()
    model = XLNetLMHeadModel(XLNetConfig(**XLNET_CONFIG)).eval()
    model.load_state_dict(reference.state_dict())
    runs = {name: make_generate(m, True, use_mems=True) for name, m in (("ours", model), ("transformers", reference))}
    prompt = torch.randint(1, 32000, (1, 64), generator=torch.Generator().manual_seed(0))
    same = torch.equal(runs["ours"](prompt, 8), runs["transformers"](prompt, 8))
    print(f"XLNet greedy tokens identical to transformers: {same}")
    results = {}
    for prompt_len in prompts:
        prompt = torch.randint(1, 32000, (1, prompt_len), generator=torch.Generator().manual_seed(0))
        rows = {name: [] for name in runs}
        for run in runs.values():
            run(prompt, 2)  # warm-up
        for _ in range(rounds):
            for name, run in runs.items():
                rows[name].append(seconds_per_token(run, prompt, 12))
        results[prompt_len] = rows
    print_table("XLNet (d_model 512, 6 layers, use_mems)", results, "ours")


def legacy_worker(folder):
    """Runs under transformers 4.37.2: loads the folder, answers {"prompt_len", "new_tokens"} timing requests and
    {"prompt_len", "tokens"} parity requests."""
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
        print(json.dumps({"value": seconds_per_token(generate, prompt, request["new_tokens"])}), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help="python of a venv with transformers==4.37.2")
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["transfo-xl", "xlnet"], choices=["transfo-xl", "xlnet"])
    parser.add_argument("--legacy-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.legacy_worker:
        return legacy_worker(args.legacy_worker)

    torch.set_num_threads(2)
    if "transfo-xl" in args.models:
        bench_transfo_xl(args.prompts, args.rounds, args.legacy_python)
    if "xlnet" in args.models:
        bench_xlnet(args.prompts, args.rounds)


def bench_transfo_xl(prompts, rounds, legacy_python):
    """Ours with the cache, ours recomputing, and (with `legacy_python`) transformers 4.37.2 in a worker."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**CONFIG)).eval()
    folder = Path(tempfile.mkdtemp(prefix="bench_txl_"))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # every key, as legacy files hold them

    legacy = None
    if legacy_python:
        legacy = subprocess.Popen(
            [legacy_python, __file__, "--legacy-worker", str(folder)],
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
        print(f"Transformer-XL greedy tokens identical to legacy (zero_initial_mems=True): {same}")
        model.config.zero_initial_mems = False

    results = {}
    for prompt_len in prompts:
        prompt = torch.randint(1, CONFIG["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(0))
        cached(prompt, 2), recompute(prompt, 2)  # warm-up
        rows = {"ours (cache)": [], "ours (recompute)": [], "legacy 4.37.2": []}
        for _ in range(rounds):
            rows["ours (cache)"].append(seconds_per_token(cached, prompt, 12))
            if legacy:
                rows["legacy 4.37.2"].append(ask_legacy({"prompt_len": prompt_len, "new_tokens": 12})["value"])
            rows["ours (recompute)"].append(seconds_per_token(recompute, prompt, 3))
        results[prompt_len] = {name: values for name, values in rows.items() if values}
    print_table("Transformer-XL (d_model 512, 6 layers, mem_len 1600)", results, "ours (cache)")
    if legacy:
        legacy.stdin.close()
        legacy.wait()


if __name__ == "__main__":
    main()
