"""What int8 and bf16 cost and buy on a trained model: decoding speed, greedy-token agreement and bits per character.

    transformers-xl demo --output-dir demo-model           # once: trains the demo's model (minutes)
    python benchmarks/bench_quantization.py demo-model [--new-tokens 256] [--eval-chars 16384] [--rounds 3]

Variants of the demo's model (`FOLDER/model`): fp32 (the reference), int8 (`quantize_dynamic_int8`: torch.ao dynamic
quantization of every linear layer), bf16 (the weights cast, `model.to(torch.bfloat16)`) and, when torchao is
installed, torchao's int8 weight-only (`quantize_(model, Int8WeightOnlyConfig())`). For each:

- decoding speed: seconds per new token of greedy decoding (batch 1, the memory cache), the median interval between
  decoding steps (bench_generation.py's clock), the variants alternating over `--rounds` rounds; speed-up over fp32;
- greedy agreement over `--new-tokens` tokens: the variant reads fp32's greedy continuation of a held-out prompt
  (teacher forcing, so that one early difference does not decide the rest) and the share of positions where its own
  top token is fp32's; also the length of the identical prefix of its free-running greedy continuation;
- the same decoding speed on the issue's configuration (d_model 512, 6 layers, vocabulary 32000 split [4000, 12000]:
  37M parameters, random weights, which decode as fast as trained ones): the demo's 0.9M-parameter model fits in the
  CPU caches, so its steps cost their per-operation overhead, not the weight reads that int8 and bf16 shrink
  (`--no-issue-speed` leaves it out);
- bits per character on the demo's held-out text (the Python files it did not train on), read in `--rows` rows of
  consecutive segments of the model's `tgt_len` characters with the memory, and the change against fp32.

Writes a table to stdout and `--output` (JSON). Machine load moves the times: compare within one run.
"""

import argparse
import copy
import json
import math
import statistics
from pathlib import Path

import torch
from bench_generation import CONFIG, make_generate, random_prompt, seconds_per_token
from timing import alternate
from transformers import AutoModelForCausalLM, AutoTokenizer

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel

from transformers_xl.modeling.memory_cache import MemoryCache
from transformers_xl.modeling.quantization import quantize_dynamic_int8
from transformers_xl.training.demo import read_stream, stdlib_files


def variants(model) -> dict:
    """{name: model} for fp32 and every variant this environment can make."""
    models = {"fp32": model, "int8": quantize_dynamic_int8(model), "bf16": copy.deepcopy(model).to(torch.bfloat16)}
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except ImportError:
        print("torchao is not installed: its int8 weight-only variant is not measured")
    else:
        weight_only = copy.deepcopy(model)
        quantize_(weight_only, Int8WeightOnlyConfig())
        models["int8 weight-only (torchao)"] = weight_only
    return models


@torch.inference_mode()
def bits_per_character(model, ids: torch.Tensor, rows: int) -> float:
    """Mean NLL in bits of every character after the first of each row: `rows` rows of consecutive text, read in
    segments of `tgt_len` with the memory."""
    length = ids.shape[0] // rows
    stream = ids[: rows * length].view(rows, length)
    segment, mems, total, count = model.config.tgt_len, None, 0.0, 0
    for start in range(0, length - 1, segment):
        chunk = stream[:, start : start + segment + 1]  # (one character more: the last one's target)
        output = model(chunk[:, :-1], mems=mems)
        mems = output.mems
        log_p = output.logits.float().log_softmax(-1)
        total -= log_p.gather(-1, chunk[:, 1:, None]).sum().item()
        count += chunk[:, 1:].numel()
    return total / count / math.log(2)


@torch.inference_mode()
def greedy_agreement(model, prompt: torch.Tensor, reference: torch.Tensor) -> dict:
    """Teacher-forced top-1 agreement with the reference's greedy continuation (read as generate reads it: the
    prompt, then one token per step with the memory cache, so that the context is the same as the reference's), and
    the identical prefix of the model's own greedy continuation."""
    new_tokens = reference.shape[1] - prompt.shape[1]
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    predictions = [model(prompt, cache=cache).logits[0, -1].argmax()]
    for position in range(prompt.shape[1], reference.shape[1] - 1):
        predictions.append(model(reference[:, position : position + 1], cache=cache).logits[0, -1].argmax())
    agreement = (torch.stack(predictions) == reference[0, prompt.shape[1] :]).float().mean().item()
    own = make_generate(model, True)(prompt, new_tokens)[0, prompt.shape[1] :]
    differing = (own != reference[0, prompt.shape[1] :]).nonzero()
    return {"agreement": agreement, "identical_prefix": differing[0, 0].item() if len(differing) else new_tokens}


def decoding_times(models: dict, prompt: torch.Tensor, rounds: int) -> dict:
    """{name: [seconds per new token]} of greedy decoding from `prompt`, the models alternating round by round."""
    generators = {name: make_generate(model, True) for name, model in models.items()}
    for generate in generators.values():
        generate(prompt, 2)  # warm-up
    runs = {name: (lambda g=generate: seconds_per_token(g, prompt, 32)) for name, generate in generators.items()}
    return alternate(runs, rounds, warmup=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a `transformers-xl demo` output folder (with model/)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-chars", type=int, default=128)
    parser.add_argument("--eval-chars", type=int, default=16384, help="held-out characters for bits per character")
    parser.add_argument("--rows", type=int, default=16, help="rows the held-out text is read in")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own count)")
    parser.add_argument("--no-issue-speed", action="store_true", help="skip the speed on the issue's configuration")
    parser.add_argument("--output", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = AutoModelForCausalLM.from_pretrained(args.folder / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.folder / "model")
    _, _, held_out = stdlib_files()
    text, _ = read_stream(tokenizer, held_out, args.eval_chars + args.prompt_chars, "reading held-out files")
    prompt, text = text[None, : args.prompt_chars], text[args.prompt_chars :]
    models = variants(model)
    reference = make_generate(model, True)(prompt, args.new_tokens)

    results = {}
    for name, variant in models.items():
        bpc = bits_per_character(variant, text, args.rows)
        results[name] = {"bpc": bpc, **greedy_agreement(variant, prompt, reference)}
    times = decoding_times(models, prompt, args.rounds)
    fp32 = results["fp32"]
    fp32_seconds = statistics.median(times["fp32"])
    print(f"\n{args.folder / 'model'}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, "
          f"{torch.get_num_threads()} threads, {args.new_tokens} greedy tokens, {text.numel()} held-out characters")  # fmt: skip
    print("| variant | ms / token (median) | speed-up | greedy agreement | identical prefix | bpc | bpc change |")
    print("|---|---|---|---|---|---|---|")
    for name, result in results.items():
        seconds = statistics.median(times[name])
        result.update(seconds_per_token=times[name], speedup=fp32_seconds / seconds,
                      bpc_change=result["bpc"] / fp32["bpc"] - 1)  # fmt: skip
        print(f"| {name} | {seconds * 1e3:.2f} | {result['speedup']:.2f}x | {100 * result['agreement']:.1f}% | "
              f"{result['identical_prefix']} / {args.new_tokens} | {result['bpc']:.4f} | "
              f"{100 * result['bpc_change']:+.2f}% |")  # fmt: skip
    if not args.no_issue_speed:
        torch.manual_seed(0)
        issue_model = TransfoXLLMHeadModel(TransfoXLConfig(**dict(CONFIG, cutoffs=[4000, 12000]))).eval()
        issue_times = decoding_times(variants(issue_model), random_prompt(64, CONFIG["vocab_size"]), args.rounds)
        issue_fp32 = statistics.median(issue_times["fp32"])
        parameters = sum(p.numel() for p in issue_model.parameters()) / 1e6
        print(f"\nThe issue's configuration ({parameters:.1f}M parameters), greedy decoding after a 64-token prompt:\n"
              "| variant | ms / token (median) | speed-up |\n|---|---|---|")
        for name, values in issue_times.items():
            seconds = statistics.median(values)
            print(f"| {name} | {seconds * 1e3:.2f} | {issue_fp32 / seconds:.2f}x |")
            results[name]["issue_config_seconds_per_token"] = values
    if args.output:
        args.output.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
