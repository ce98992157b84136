"""New-token throughput of generation, ours against the references on the same weights, in one run.

Transformer-XL: ours with the memory cache, ours recomputing the whole sequence every step, and the legacy
transformers 4.37.2 implementation. XLNet: ours and transformers' XLNet (v5), both with `use_mems=True` (the
dummy-token scheme; memory kept whole, as the Hub configs' `mem_len: null` says).

    python benchmarks/bench_generation.py [--legacy-python /path/to/venv/bin/python] [--prompts 64 256 1024]
                                          [--device cuda] [--attn-implementation sdpa] [--threads 2]

The legacy implementation needs transformers 4.37.2, which cannot share a process with transformers v5: it runs in
a worker process under the legacy venv's python (`--legacy-python`, or $TRANSFORMERS_XL_LEGACY_PYTHON;
docs/benchmarks.md says how to make that venv), kept warm and driven round by round, so ours and the reference
alternate (A, B, B, A). Without it only our two modes are measured. `benchmarks/run.py` runs this benchmark among the
others.

Per-token time excludes the prompt: a logits processor timestamps every decoding step (after the device has run it),
and a run's time per token is the median interval between consecutive steps after the first (the prompt's). Greedy
decoding, fp32, eval mode, on torch's own thread count unless `--threads` says otherwise. Reports min and median over
rounds and the ratios.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from devices import attention_implementation, parse_device, synchronize

from timing import LEGACY_PYTHON_ENV, Worker, alternate, legacy_python, serve

CONFIG = dict(  # the measurement config of shared/reference/performance-notes.md, wt103-like memory
    vocab_size=32000, cutoffs=[8000, 16000], d_model=512, d_embed=512, n_head=8, d_head=64, d_inner=2048,
    div_val=1, n_layer=6, mem_len=1600, clamp_len=1000, same_length=False, dropout=0.0, dropatt=0.0,
    tie_projs=[False, False, False], eos_token_id=None,
)  # fmt: skip
XLNET_CONFIG = dict(vocab_size=32000, d_model=512, n_head=8, d_inner=2048, n_layer=6, dropout=0.0, mem_len=None)


class StepClock:
    """A logits processor that only records when each decoding step reaches it, once the device has run the step."""

    def __init__(self, device):
        self.device = device
        self.times = []

    def __call__(self, input_ids, scores):
        synchronize(self.device)
        self.times.append(time.perf_counter())
        return scores


def seconds_per_token(generate, prompt, new_tokens):
    """Median seconds between consecutive decoding steps, the prompt's step excluded."""
    clock = StepClock(prompt.device)
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


def random_prompt(length, vocab_size, device="cpu"):
    return torch.randint(1, vocab_size, (1, length), generator=torch.Generator().manual_seed(0)).to(device)


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


def bench_xlnet(prompts, rounds, config=XLNET_CONFIG, new_tokens=12, device="cpu", attn_implementation="sdpa"):
    """Ours vs transformers' XLNet (same weights, same process, alternating), on `device`, each with
    `attn_implementation` where it supports it (`devices.attention_implementation`). Returns ({prompt_len: {name:
    [seconds per token]}}, whether the greedy tokens are identical)."""
    import transformers

    import transformers_xl

    sides = {"ours": (transformers_xl.XLNetConfig, transformers_xl.XLNetLMHeadModel),
             "transformers": (transformers.XLNetConfig, transformers.XLNetLMHeadModel)}  # fmt: skip
    models = {}
    torch.manual_seed(0)
    for name, (config_class, model_class) in sides.items():
        attention = attention_implementation(model_class, attn_implementation)
        models[name] = model_class(config_class(**config, attn_implementation=attention)).eval()
    models["ours"].load_state_dict(models["transformers"].state_dict())  # (the same weights)
    models = {name: model.to(device) for name, model in models.items()}
    runs = {name: make_generate(model, True, use_mems=True) for name, model in models.items()}
    prompt = random_prompt(min(prompts), config["vocab_size"], device)
    same = torch.equal(runs["ours"](prompt, 8), runs["transformers"](prompt, 8))
    print(f"XLNet greedy tokens identical to transformers: {same}")
    results = {}
    for prompt_len in prompts:
        prompt = random_prompt(prompt_len, config["vocab_size"], device)
        timed = {name: (lambda run=run: seconds_per_token(run, prompt, new_tokens)) for name, run in runs.items()}
        for run in runs.values():
            run(prompt, 2)  # warm-up
        results[prompt_len] = alternate(timed, rounds, warmup=0)
    print_table(f"XLNet (d_model {config['d_model']}, {config['n_layer']} layers, use_mems)", results, "ours")
    return results, same


def legacy_worker(folder, threads, device, attn_implementation):
    """Runs under transformers 4.37.2 on `threads` threads (the benchmark's own process): loads the folder onto
    `device`, answers {"prompt_len", "new_tokens"} timing requests and {"prompt_len", "tokens"} parity requests."""
    from transformers import TransfoXLLMHeadModel

    torch.set_num_threads(int(threads))
    attention = attention_implementation(TransfoXLLMHeadModel, attn_implementation)
    model = TransfoXLLMHeadModel.from_pretrained(folder, attn_implementation=attention).eval().to(device)
    generate = make_generate(model, use_cache=True)  # the legacy model takes no attention_mask

    def handle(request):
        prompt = random_prompt(request["prompt_len"], model.config.vocab_size, device)
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
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    parser.add_argument("--attn-implementation", default="sdpa", choices=["eager", "sdpa", "flex_attention"])
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own count)")
    parser.add_argument("--legacy-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.legacy_worker:
        return legacy_worker(*args.legacy_worker)
    try:
        device = parse_device(args.device)
    except ValueError as error:
        parser.error(str(error))
    if args.threads:
        torch.set_num_threads(args.threads)
    placement = {"device": str(device), "attn_implementation": args.attn_implementation}
    if "transfo-xl" in args.models:
        bench_transfo_xl(args.prompts, args.rounds, legacy_python(args.legacy_python), **placement)
    if "xlnet" in args.models:
        bench_xlnet(args.prompts, args.rounds, **placement)


def transfo_xl_sides(config, legacy_python, device="cpu", attn_implementation="sdpa"):
    """Our model (random weights from seed 0) on `device`, its generate with the cache and recomputing, and (with
    `legacy_python`) a transformers 4.37.2 worker that loaded the same weights, or None."""
    from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

    torch.manual_seed(0)
    attention = attention_implementation(TransfoXLLMHeadModel, attn_implementation)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**config, attn_implementation=attention)).eval()
    folder = Path(tempfile.mkdtemp(prefix="bench_txl_"))
    model.config.save_pretrained(folder)
    torch.save(model.state_dict(), folder / "pytorch_model.bin")  # every key, as legacy files hold them
    model.to(device)
    legacy = None
    if legacy_python:
        worker_args = (str(folder), str(torch.get_num_threads()), device, attn_implementation)
        legacy = Worker(legacy_python, __file__, "--legacy-worker", *worker_args)
    cached, recompute = (make_generate(model, use_cache, attention_mask=None) for use_cache in (True, False))
    return model, cached, recompute, legacy


def bench_transfo_xl(prompts, rounds, legacy_python, config=CONFIG, new_tokens=12, device="cpu",
                     attn_implementation="sdpa"):  # fmt: skip
    """Ours with the cache, ours recomputing, and (with `legacy_python`) transformers 4.37.2 in a worker, on
    `device`. Returns ({prompt_len: {name: [seconds per token]}}, whether the greedy tokens equal legacy's, None
    without legacy)."""
    model, cached, recompute, legacy = transfo_xl_sides(config, legacy_python, device, attn_implementation)
    same = None
    if legacy:  # parity first: legacy starts from zero memory vectors, so compare in that mode
        model.config.zero_initial_mems = True
        prompt = random_prompt(min(prompts), config["vocab_size"], device)
        same = cached(prompt, 8)[0].tolist() == legacy.ask({"prompt_len": min(prompts), "tokens": 8})["tokens"]
        print(f"Transformer-XL greedy tokens identical to legacy (zero_initial_mems=True): {same}")
        model.config.zero_initial_mems = False

    results = {}
    for prompt_len in prompts:
        prompt = random_prompt(prompt_len, config["vocab_size"], device)
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


def compile_config(device):
    """generate()'s compilation of a static cache's step, as for transformers' own models: CUDA graphs on a GPU
    ("reduce-overhead"), inductor's default kernels elsewhere (transformers compiles on a CPU only when the config
    asks for it: `_compile_all_devices`). One graph, no break, the same shapes at every step."""
    from transformers import CompileConfig

    mode = "reduce-overhead" if torch.device(device).type == "cuda" else "default"
    config = CompileConfig(fullgraph=True, dynamic=False, mode=mode)
    config._compile_all_devices = True
    return config


def bench_static(config_class, model_class, config, prompt_len, rounds, new_tokens=12, device="cpu",
                 dtype=torch.float32, attn_implementation="sdpa", compiled=True):  # fmt: skip
    """Our Transformer-XL or XLNet (`model_class`; random weights from seed 0, in `dtype`): with the static cache
    and (`compiled`) generate()'s compiled step against ours eager with the default cache, alternating. Returns
    ({"static": [seconds per token], "eager": [...]}, seconds of the first static call (3 new tokens: the prompt,
    the compilation, two steps), whether both give the same 8 greedy tokens)."""
    torch.manual_seed(0)
    attention = attention_implementation(model_class, attn_implementation)
    model = model_class(config_class(**config, attn_implementation=attention)).eval().to(device, dtype)
    eager = make_generate(model, True, attention_mask=None)
    static = make_generate(
        model, True, attention_mask=None, cache_implementation="static",
        compile_config=compile_config(device) if compiled else None,
    )  # fmt: skip
    prompt = random_prompt(prompt_len, config["vocab_size"], device)
    start = time.perf_counter()
    static(prompt, 3)
    synchronize(device)
    first_call = time.perf_counter() - start
    same = torch.equal(static(prompt, 8), eager(prompt, 8))
    runs = {"static": lambda: seconds_per_token(static, prompt, new_tokens),
            "eager": lambda: seconds_per_token(eager, prompt, new_tokens)}  # fmt: skip
    return alternate(runs, rounds, warmup=0), first_call, same


def streamed_weight_bytes(model) -> int:
    """Bytes of the weights a decoding step must read: every parameter once (tied ones once), except the input
    embedding's tables, of which a step reads one row (unless the output layer shares them), and the relative
    position projections, whose products the memory cache keeps."""
    tables = {f"{name}.weight" for name, module in model.named_modules() if isinstance(module, torch.nn.Embedding)}
    read = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name not in tables and not name.endswith(("r_net.weight", "rel_attn.r.weight")):
            read[id(parameter)] = parameter.numel() * parameter.element_size()
    return sum(read.values())


if __name__ == "__main__":
    main()
