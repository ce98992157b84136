"""What the test suite checks on CPU, checked on another device: the attention implementations agree, a step makes
no more host syncs than its design needs, and the same inputs give the same bits in every process.

    python benchmarks/check_device.py --device cuda     # the first machine with a GPU runs this beside run.py
    python benchmarks/check_device.py                   # the same on CPU (tests/test_benchmarks.py runs a part)
    python benchmarks/check_device.py --device cuda --checks syncs     # some of them: agreement, syncs, determinism

For both models (small configurations, fp32, dropout 0):
- agreement: "sdpa" and "flex_attention" against "eager", the logits of a segment after a memory (eval) and the
  gradients of a training step with labels, within 1e-4 (on CPU flex's training step runs sdpa: torch has no CPU
  flex backward);
- host syncs: counted with tests/host_syncs.py's dispatch mode in a training step and a decoding step, and on CUDA
  also by torch's own sync debug mode (the ops a dispatch mode cannot see); Transformer-XL may sync once per
  adaptive-softmax tail cluster in training, nothing else may;
- determinism: the training step's logits, loss and gradients in 3 fresh processes, hashed, with and without
  `torch.use_deterministic_algorithms(True)`.
Prints one line per check and exits with status 1 if any fails.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from host_syncs import HostSyncCounter  # noqa: E402

from transformers_xl.modeling.memory_cache import MemoryCache  # noqa: E402
from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel  # noqa: E402

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
TOLERANCE = 1e-4
PROCESSES = 3


def transfo_xl(device):
    torch.manual_seed(0)
    config = TransfoXLConfig(vocab_size=500, cutoffs=[100, 300], d_model=64, d_embed=64, n_head=4, d_head=16,
                             d_inner=128, div_val=2, n_layer=2, mem_len=16, tgt_len=16, same_length=True,
                             dropout=0.0, dropatt=0.0)  # fmt: skip
    return TransfoXLLMHeadModel(config).to(device)


def xlnet(device):
    torch.manual_seed(0)
    config = XLNetConfig(vocab_size=500, d_model=64, n_layer=2, n_head=4, d_inner=128, mem_len=16, dropout=0.0)
    return XLNetLMHeadModel(config).to(device)


MODELS = {"transfo-xl": transfo_xl, "xlnet": xlnet}


def segments(name, device):
    """Two segments of 16 tokens (the second attends to the first's memory) and, for XLNet, a factorisation order
    that hides the last 4 tokens, which are its targets (both streams run)."""
    generator = torch.Generator().manual_seed(1)
    first, second = (torch.randint(10, 500, (2, 16), generator=generator).to(device) for _ in range(2))
    extra = {}
    if name == "xlnet":
        perm_mask = torch.zeros(2, 16, 16)
        perm_mask[:, :, -4:] = 1
        target_mapping = torch.zeros(2, 4, 16)
        target_mapping[:, torch.arange(4), torch.arange(12, 16)] = 1
        extra = dict(perm_mask=perm_mask.to(device), target_mapping=target_mapping.to(device), use_mems=True)
    return first, second, extra


def labels_for(name, ids):
    return ids[:, -4:] if name == "xlnet" else ids


def training_step(name, model, inputs):
    """Per-token outputs (XLNet's logits; Transformer-XL's losses, which it returns instead with labels), loss and
    gradients of a forward + backward with labels over the second segment, after the first's memory."""
    first, second, extra = inputs
    model.train().zero_grad()
    mems = model(first, **extra).mems
    output = model(second, mems=[m.detach() for m in mems], labels=labels_for(name, second), **extra)
    output.loss.backward()
    gradients = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    per_token = output.losses if name == "transfo-xl" else output.logits
    return per_token.detach(), output.loss.detach(), gradients


def evaluation_logits(name, model, device):
    first, second, extra = segments(name, device)
    with torch.no_grad():
        mems = model.eval()(first, **extra).mems
        return model(second, mems=mems, **extra).logits


def largest_difference(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


def check_agreement(name, device, report):
    model = MODELS[name](device)
    results = {}
    for implementation in IMPLEMENTATIONS:
        model.set_attn_implementation(implementation)
        logits = evaluation_logits(name, model, device)
        results[implementation] = logits, training_step(name, model, segments(name, device))[2]
    eager_logits, eager_gradients = results["eager"]
    for implementation in IMPLEMENTATIONS[1:]:
        logits, gradients = results[implementation]
        difference = largest_difference(logits, eager_logits)
        report(difference <= TOLERANCE, f"{name} {implementation} vs eager: evaluation logits max |diff| {difference:.1e}")
        difference = max(largest_difference(g, eager_gradients[n]) for n, g in gradients.items())
        same_names = gradients.keys() == eager_gradients.keys()
        report(same_names and difference <= TOLERANCE,
               f"{name} {implementation} vs eager: training gradients max |diff| {difference:.1e}")  # fmt: skip


def decoding_step(name, model, device):
    """One greedy step of `generate()` after a prompt: inputs prepared against the memory cache, then the forward
    (each call decodes the next token)."""
    tokens = segments(name, device)[0]
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    flag = {"use_mems": True} if name == "xlnet" else {"use_cache": True}

    def step():
        nonlocal tokens
        with torch.no_grad():
            inputs = model.prepare_inputs_for_generation(tokens, cache=cache, **flag)
            tokens = torch.cat([tokens, model(**inputs).logits[:, -1:].argmax(-1)], dim=1)

    model.eval()
    step()  # (the prompt)
    return step


def count_syncs(step, device) -> tuple[int, int | None]:
    """(syncing ops seen by the dispatch mode, syncs torch's CUDA sync debug mode warned of, or None off CUDA)."""
    with HostSyncCounter() as counter:
        step()
    if device.type != "cuda":
        return counter.count, None
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    for place in dict.fromkeys(syncs):  # (where the syncing op was called from, each place once)
        print(f"      CUDA sync at {place} ({syncs.count(place)}x)")
    return counter.count, len(syncs)


def check_host_syncs(name, device, report):
    model = MODELS[name](device)
    allowed = len(model.config.cutoffs) if name == "transfo-xl" else 0  # one per tail cluster
    inputs = segments(name, device)  # (made beforehand: copies of the inputs to the device are the caller's)
    ops, cuda = count_syncs(lambda: training_step(name, model, inputs), device)
    report(ops <= allowed and (cuda or 0) <= allowed,
           f"{name} training step: host syncs {described(ops, cuda)} (at most {allowed})")  # fmt: skip
    step = decoding_step(name, model, device)
    step()  # (the first step may set up what later ones reuse)
    ops, cuda = count_syncs(step, device)
    report(ops == 0 and not cuda, f"{name} decoding step: host syncs {described(ops, cuda)} (none allowed)")


def described(ops: int, cuda: int | None) -> str:
    return f"{ops} by dispatch" + ("" if cuda is None else f", {cuda} by CUDA's sync debug mode")


def step_digest(name, device) -> str:
    """sha256 of the training step's logits, loss and gradients (their bytes)."""
    logits, loss, gradients = training_step(name, MODELS[name](device), segments(name, device))
    digest = hashlib.sha256()
    for tensor in (logits, loss, *(gradients[n] for n in sorted(gradients))):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def check_determinism(name, device, report):
    for deterministic in (False, True):
        command = [sys.executable, __file__, "--device", str(device), "--digest-of", name]
        env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8") if deterministic else None
        if deterministic:
            command.append("--deterministic")
        digests = [subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout.strip()
                   for _ in range(PROCESSES)]  # fmt: skip
        flag = "with" if deterministic else "without"
        report(len(set(digests)) == 1,
               f"{name} training step {flag} use_deterministic_algorithms: {len(set(digests))} distinct results in {PROCESSES} processes")  # fmt: skip


CHECKS = {"agreement": check_agreement, "syncs": check_host_syncs, "determinism": check_determinism}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--checks", nargs="+", choices=sorted(CHECKS), default=list(CHECKS), help="default: all")
    parser.add_argument("--digest-of", choices=sorted(MODELS), help=argparse.SUPPRESS)
    parser.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.digest_of:  # (a worker of check_determinism)
        torch.use_deterministic_algorithms(args.deterministic)
        print(step_digest(args.digest_of, device))
        return 0
    failures = []

    def report(passed: bool, line: str):
        print(("ok    " if passed else "FAIL  ") + line, flush=True)
        if not passed:
            failures.append(line)

    print(f"torch {torch.__version__} on {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""))
    for name in MODELS:
        for check in args.checks:
            CHECKS[check](name, device, report)
    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
