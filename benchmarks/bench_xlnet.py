"""XLNet forward speed: ours vs transformers' XLNet (v5) on the same weights, in one process.

    python benchmarks/bench_xlnet.py                   # default: LM forward over 2 segments with mems
    python benchmarks/bench_xlnet.py --rounds 5 --workloads lm2 plm body --threads 2
    python benchmarks/bench_xlnet.py --quick           # tiny sizes, a few seconds (smoke test)

Workloads (config of shared/reference/performance-notes.md: d_model 512, 6 layers, 8 heads, d_inner 2048, vocab
32000, batch 4, seq 512, mem_len 512, fp32, eval, dropout 0, `inference_mode`):
- `lm2`  LM head over two segments: segment 1 without memory, segment 2 attending to segment 1's mems (k = 1024);
- `plm`  permutation-LM forward, two-stream attention with perm_mask and target_mapping (85 targets), one segment;
- `body` the base model only, segment 2 with mems.

Method: parity is checked first (max |logit diff|), then each workload is warmed up (2 calls per side) and timed in
interleaved rounds (ours, transformers, ours, transformers, ...), `--repeats` calls per side per round. Reports the
min and median seconds of each side and the ratio transformers / ours (> 1: ours is faster). The default run
(lm2, 3 rounds x 1 repeat) takes about a minute on 2 cores.
"""

import argparse

import torch
import transformers
from timing import alternate, seconds, summary

from transformers_xl import XLNetConfig, XLNetLMHeadModel

CONFIG = dict(
    vocab_size=32000, d_model=512, n_layer=6, n_head=8, d_inner=2048, dropout=0.0, mem_len=512,
    ff_activation="gelu", attn_type="bi",
)  # fmt: skip
QUICK = dict(vocab_size=1000, d_model=64, n_layer=2, n_head=4, d_inner=128, dropout=0.0, mem_len=64)


def build(config_kwargs):
    torch.manual_seed(0)
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**config_kwargs)).eval()
    model = XLNetLMHeadModel(XLNetConfig(**config_kwargs)).eval()
    model.load_state_dict(reference.state_dict(), strict=True)
    return reference, model


def plm_inputs(batch, length, num_predict, generator):
    """Each row predicts its last `num_predict` positions in a random order of those (the rest visible)."""
    perm_mask = torch.zeros(batch, length, length)
    target_mapping = torch.zeros(batch, num_predict, length)
    targets = torch.arange(length - num_predict, length)
    for b in range(batch):
        order = targets[torch.randperm(num_predict, generator=generator)]
        rank = torch.zeros(length, dtype=torch.long)
        rank[order] = torch.arange(1, num_predict + 1)
        perm_mask[b] = ((rank[None, :] >= rank[:, None]) & (rank[None, :] > 0)).float()
        target_mapping[b, torch.arange(num_predict), targets] = 1.0
    return perm_mask, target_mapping


def workloads(batch, length, num_predict, vocab_size):
    generator = torch.Generator().manual_seed(0)
    first = torch.randint(0, vocab_size, (batch, length), generator=generator)
    second = torch.randint(0, vocab_size, (batch, length), generator=generator)
    perm_mask, target_mapping = plm_inputs(batch, length, num_predict, generator)

    def lm2(model):
        out = model(first, use_mems=True)
        return model(second, mems=out.mems, use_mems=True).logits

    def plm(model):
        return model(first, perm_mask=perm_mask, target_mapping=target_mapping).logits

    def body(model, _mems={}):
        key = id(model)
        if key not in _mems:  # segment 1 is computed once, outside the timing
            _mems[key] = model(first, use_mems=True).mems
        return model.transformer(second, mems=_mems[key], use_mems=True).last_hidden_state

    return {"lm2": lm2, "plm": plm, "body": body}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["lm2"], choices=["lm2", "plm", "body"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's own count)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--num-predict", type=int, default=85)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the script")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = QUICK if args.quick else CONFIG
    if args.quick:
        args.length, args.num_predict, args.warmup, args.rounds = 64, 8, 1, 2

    reference, model = build(config)
    runs = workloads(args.batch, args.length, args.num_predict, config["vocab_size"])
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} threads")
    print(f"config {config}, batch {args.batch}, seq {args.length}")
    with torch.inference_mode():
        for name in args.workloads:
            fn = runs[name]
            diff = (fn(reference) - fn(model)).abs().max().item()
            sides = {"ours": lambda: seconds(fn, model), "transformers": lambda: seconds(fn, reference)}
            times = alternate(sides, args.rounds, warmup=args.warmup, repeats=args.repeats)
            ours, theirs = summary(times["ours"]), summary(times["transformers"])
            print(
                f"{name:5s} ours min {ours['min']:.3f} s / median {ours['median']:.3f} s | "
                f"transformers min {theirs['min']:.3f} s / median {theirs['median']:.3f} s | "
                f"ratio (transformers / ours) min {theirs['min'] / ours['min']:.2f}x, "
                f"median {theirs['median'] / ours['median']:.2f}x | max |logit diff| {diff:.2e}"
            )


if __name__ == "__main__":
    main()
