"""New-token throughput of generation, ours against the references on the same weights, in one run.

Transformer-XL: ours with the memory cache, ours recomputing the whole sequence every step, and the legacy
transformers 4.37.2 implementation. XLNet: ours and transformers' XLNet (v5), both with `use_mems=True` (the
dummy-token scheme; memory kept whole, as the Hub configs' `mem_len: null` says).

    python benchmarks/bench_generation.py [--legacy-python /path/to/venv/bin/python] [--prompts 64 256 1024]

The legacy implementation needs transformers 4.37.2, which cannot share a process with transformers v5: it runs in
a worker process under the legacy venv's python (`--legacy-python`, or $TRANSFORMERS_XL_LEGACY_PYTHON; README,
"Benchmarks", says how to make that venv), kept warm and driven round by round, so ours and the reference alternate
(A, B, B, A). Without it only our two modes are measured. `benchmarks/run.py` runs this benchmark among the others.

Per-token time excludes the prompt: a logits processor timestamps every decoding step, and a run's time per token
is the median interval between consecutive steps after the first (the prompt's). Greedy decoding, fp32, 2 threads,
eval mode. Reports min and median over rounds and the ratios.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from timing import LEGACY_PYTHON_ENV, Worker, alternate, legacy_python, seconds, serve

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
    """`run(prompt, new_tokens, clock)`: greedy generation of exactly `new_tokens` tokens. The count is kept by
    generating with no end-of-sequence id rather than by `min_new_tokens`, whose logits processor compares the
    whole vocabulary with the end-of-sequence id at every step (0.8 ms of an XLNet step over 32000 words), which
    is not decoding."""

    def run(prompt, new_tokens, clock=None):
        from transformers import LogitsProcessorList

        with torch.inference_mode():
            return model.generate(
                prompt,
                **extra,
                logits_processor=LogitsProcessorList([clock] if clock else []),
                max_new_tokens=new_tokens,
                eos_token_id=None,
                do_sample=False,
                use_cache=use_cache,
                pad_token_id=0,
            )

    return run


def random_prompt(length, vocab_size):
    return torch.randint(1, vocab_size, (1, length), generator=torch.Generator().manual_seed(0))


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


def bench_xlnet(prompts, rounds, config=XLNET_CONFIG, new_tokens=12):
    """Ours vs transformers' XLNet (same weights, same process, alternating). Returns ({prompt_len: {name:
    [seconds per token]}}, whether the greedy tokens are identical)."""
    import transformers

    from transformers_xl.modeling.configuration_xlnet import XLNetConfig
    from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel

    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**config)).eval()
    model = XLNetLMHeadModel(XLNetConfig(**config)).eval()
    model.load_state_dict(reference.state_dict())
    runs = {name: make_generate(m, True, use_mems=True) for name, m in (("ours", model), ("transformers", reference))}
    prompt = random_prompt(min(prompts), config["vocab_size"])
    same = torch.equal(runs["ours"](prompt, 8), runs["transformers"](prompt, 8))
    print(f"XLNet greedy tokens identical to transformers: {same}")
    results = {}
    for prompt_len in prompts:
        prompt = random_prompt(prompt_len, config["vocab_size"])
        timed = {name: (lambda run=run: seconds_per_token(run, prompt, new_tokens)) for name, run in runs.items()}
        for run in runs.values():
            run(prompt, 2)  # warm-up
        results[prompt_len] = alternate(timed, rounds, warmup=0)
    print_table(f"XLNet (d_model {config['d_model']}, {config['n_layer']} layers, use_mems)", results, "ours")
    return results, same


def legacy_worker(folder):
    """Runs under transformers 4.37.2: loads the folder, answers {"prompt_len", "new_tokens"} timing requests and
    {"prompt_len", "tokens"} parity requests."""
    from transformers import TransfoXLLMHeadModel

    torch.set_num_threads(2)
    model = TransfoXLLMHeadModel.from_pretrained(folder).eval()
    generate = make_generate(model, use_cache=True)  # the legacy model takes no attention_mask

    def handle(request):
        prompt = random_prompt(request["prompt_len"], model.config.vocab_size)
        if request.get("tokens"):
            return {"tokens": generate(prompt, request["tokens"])[0].tolist()}
        return {"value": seconds_per_token(generate, prompt, request["new_tokens"])}

    serve(handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help=f"python of a transformers==4.37.2 venv (default: ${LEGACY_PYTHON_ENV})")
    parser.add_argument("--prompts", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["transfo-xl", "xlnet"], choices=["transfo-xl", "xlnet"])
    parser.add_argument("--legacy-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.legacy_worker:
        return legacy_worker(args.legacy_worker)

    torch.set_num_threads(2)
    if "transfo-xl" in args.models:
        bench_transfo_xl(args.prompts, args.rounds, legacy_python(args.legacy_python))
    if "xlnet" in args.models:
        bench_xlnet(args.prompts, args.rounds)


def transfo_xl_sides(config, legacy_python):
    """Our model (random weights from seed 0), its generate with the cache and recomputing, and (with
    `legacy_python`) a transformers 4.37.2 worker that loaded the same weights, or None."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**config)).eval()
    folder = Path(tempfile.mkdtemp(prefix="bench_txl_"))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # every key, as legacy files hold them
    legacy = Worker(legacy_python, __file__, "--legacy-worker", str(folder)) if legacy_python else None
    cached, recompute = (make_generate(model, use_cache, attention_mask=None) for use_cache in (True, False))
    return model, cached, recompute, legacy


def bench_transfo_xl(prompts, rounds, legacy_python, config=CONFIG, new_tokens=12):
    """Ours with the cache, ours recomputing, and (with `legacy_python`) transformers 4.37.2 in a worker. Returns
    ({prompt_len: {name: [seconds per token]}}, whether the greedy tokens equal legacy's, None without legacy)."""
    model, cached, recompute, legacy = transfo_xl_sides(config, legacy_python)
    same = None
    if legacy:  # parity first: legacy starts from zero memory vectors, so compare in that mode
        model.config.zero_initial_mems = True
        prompt = random_prompt(min(prompts), config["vocab_size"])
        same = cached(prompt, 8)[0].tolist() == legacy.ask({"prompt_len": min(prompts), "tokens": 8})["tokens"]
        print(f"Transformer-XL greedy tokens identical to legacy (zero_initial_mems=True): {same}")
        model.config.zero_initial_mems = False

    results = {}
    for prompt_len in prompts:
        prompt = random_prompt(prompt_len, config["vocab_size"])
        cached(prompt, 2), recompute(prompt, 2)  # warm-up
        runs = {"ours (cache)": lambda: seconds_per_token(cached, prompt, new_tokens)}
        if legacy:
            legacy.ask({"prompt_len": prompt_len, "new_tokens": 2})  # warm-up
            runs["legacy 4.37.2"] = lambda: legacy.ask({"prompt_len": prompt_len, "new_tokens": new_tokens})["value"]
        runs["ours (recompute)"] = lambda: seconds_per_token(recompute, prompt, 3)
        results[prompt_len] = alternate(runs, rounds, warmup=0)
    title = f"Transformer-XL (d_model {config['d_model']}, {config['n_layer']} layers, mem_len {config['mem_len']})"
    print_table(title, results, "ours (cache)")
    if legacy:
        legacy.close()
    return results, same


# ----------------------------------------------------------------------------------------------------------------
# Decoding beside other work

# The other work: a single-threaded busy loop pinned to one core, or a second torch process running its own threads
# (a training job, a test run: products and the small operations around them, each ending at a thread barrier).
CONTENTION = {
    "quiet": None,
    "one core busy": "import os\nos.sched_setaffinity(0, {{{cpu}}})\nprint('ready', flush=True)\nwhile True:\n    pass",
    "beside a torch process": (
        "import torch\ntorch.set_num_threads({threads})\na = torch.randn(384, 384)\nprint('ready', flush=True)\n"
        "while True:\n    torch.relu(a @ a).add_(1).softmax(-1).sum()"
    ),
}


@contextmanager
def contention(kind, threads):
    """Run the block while `CONTENTION[kind]` runs in a process of its own (started before, killed after)."""
    if CONTENTION[kind] is None:
        yield
        return
    code = CONTENTION[kind].format(cpu=max(os.sched_getaffinity(0)), threads=threads)
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        process.stdout.readline()  # (running)
        yield
    finally:
        process.kill()
        process.wait()


def bench_contention(rounds, legacy_python, config=CONFIG, new_tokens=12, prompt_len=64, threads=2):
    """Transformer-XL greedy decoding (batch 1), ours with the cache and (with `legacy_python`) transformers 4.37.2,
    alternating, quiet and under each kind of `CONTENTION`: {kind: {name: [seconds per token]}}."""
    _, cached, _, legacy = transfo_xl_sides(config, legacy_python)
    prompt = random_prompt(prompt_len, config["vocab_size"])
    runs = {"ours": lambda: seconds_per_token(cached, prompt, new_tokens)}
    if legacy:
        runs["legacy 4.37.2"] = lambda: legacy.ask({"prompt_len": prompt_len, "new_tokens": new_tokens})["value"]
    results = {}
    for kind in CONTENTION:
        with contention(kind, threads):
            results[kind] = alternate(runs, rounds, warmup=1)
        print(f"{kind}: " + ", ".join(f"{name} {statistics.median(v) * 1e3:.1f} ms/token" for name, v in
                                       results[kind].items()))  # fmt: skip
    if legacy:
        legacy.close()
    return results


def step_products(model, prompt, **generate_kwargs) -> list:
    """The products of a few rows (`decoding_linear.linear`'s decoding path) that one decoding step of `model` after
    `prompt` runs, recorded from a real step as (rows, weight, bias)."""
    from unittest import mock

    from transformers_xl.modeling import decoding_linear

    calls, few_rows = [], decoding_linear._few_rows

    def recorded(x, weight, bias, rows):
        calls.append((x.clone(), weight, bias))
        return few_rows(x, weight, bias, rows)

    # (each forward pass starts the list again: the prompt's computes its last row's logits, a few-row product too)
    hook = model.register_forward_pre_hook(lambda *_: calls.clear())
    try:
        with mock.patch.object(decoding_linear, "_few_rows", recorded):
            make_generate(model, True, **generate_kwargs)(prompt, 2)  # the prompt's forward pass, then one step
    finally:
        hook.remove()
    return calls


def products_alone(calls, passes):
    """`seconds()`: the median time of `calls` (from `step_products`) run once each, as a step runs them (on the
    threads a decoding step would take now), over `passes` passes: what a decoding step spends on its products, the
    rest of the step left out."""
    from transformers_xl.modeling import decoding_threads
    from transformers_xl.modeling.decoding_linear import linear

    def run():
        for x, weight, bias in calls:
            linear(x, weight, bias)

    def timed():
        with decoding_threads.on_a_decoding_step_threads(), torch.inference_mode():
            return statistics.median(seconds(run) for _ in range(passes))

    return timed


def streamed_weight_bytes(model) -> int:
    """Bytes of the weights a decoding step must read: every parameter once (tied ones once), except the input
    embedding's tables, of which a step reads one row (unless the output layer shares them), and the relative
    position projections, whose products the memory cache keeps."""
    tables = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.Embedding)}
    read = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name not in tables and not name.endswith(("r_net.weight", "rel_attn.r")):
            read[id(parameter)] = parameter.numel() * parameter.element_size()
    return sum(read.values())

if __name__ == "__main__":
    main()
