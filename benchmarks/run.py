"""One command for the performance claims: ours against the references, on the same weights and inputs, in one run.

    python benchmarks/run.py [--legacy-python PYTHON] [--output DIR] [--configs ...] [--workloads ...]
    python benchmarks/run.py --device cuda [--attn-implementation sdpa|eager|flex_attention] ...
    python benchmarks/run.py --configs recipes [--device cuda --autocast bf16]   # the papers' sizes
    python benchmarks/run.py --quick        # tiny sizes, under a minute: a smoke test of the whole command
    python benchmarks/run.py --keep-freed-memory ...   # both sides timed with glibc keeping freed memory

References: transformers 5's XLNet under this python; transformers 4.37.2's Transformer-XL, which cannot share a
process with transformers 5, under the legacy venv's python (`--legacy-python`, or $TRANSFORMERS_XL_LEGACY_PYTHON;
docs/benchmarks.md says how to make that venv). Without it the legacy side is reported as not measured. Every
timed side runs in a worker process of its own (its own heap: see `measure_throughput`; with --quick, a smoke test
where a worker's start, ~4 s, is most of a tiny side's time, a case's bf16 sides share one, as do its deploy sides).
Every implementation loads the same folder (config.json + pytorch_model.bin written from our randomly initialised
model) and the same inputs (the second segment, and the memory our model left after the first segment, saved beside
it), so the reference's logits are checked against ours first (max |diff|).

Every side runs on `--device` (cpu, the default, or cuda; `devices.py` waits for the device around each timed call
and measures peak memory there) with `--attn-implementation` (default sdpa) where its model supports it, else eager
(`devices.attention_implementation`; the throughput rows record what each side ran).

Workloads (batch x segment tokens per call; the memory holds `mem_len` tokens of the previous segment):
- `throughput`: evaluation (log-probabilities over the full vocabulary, `inference_mode`; the recipes': the loss of
  every target, `Case.evaluate_loss`), training forward + backward (labels, gradients), and a full training step
  (forward, backward, AdamW step, zero_grad), tokens/s; the evaluation's fraction of the device's matmul peak (fp32,
  or bf16 under --autocast bf16) on ideal FLOPs (see `ideal_forward_flops`);
- `memory`: peak memory of a training step, both sides (see `devices.peak_memory`): on CPU each in a fresh worker,
  on CUDA and with --quick in the throughput's workers where both workloads run (`memory_in_timing_workers`);
- `bf16`: ours under bf16 autocast against ours in fp32 (evaluation and training);
- `compile`: `torch.compile(model)` against eager, ours, evaluation and training forward + backward; failures are
  reported, with their error, instead of stopping the run (the first configuration only);
- `generation`: new tokens/s of greedy decoding (`bench_generation.py`), ours against both references, and ours
  against the weight-streaming floor: the bytes of weights a decoding step must read (`streamed_weight_bytes`)
  over the memory bandwidth of a matrix-vector product (`gemv_bandwidth`);
- `static`: both models' decoding with the static cache and generate()'s compiled step against ours eager, fp32
  and bf16, at the deploy workload's decoding shapes (`measure_static_decoding`; on `--device cuda` the step runs as
  CUDA graphs, mode "reduce-overhead");
- `stream`: Transformer-XL evaluation of a long stream with the memory (segments of half the attention length,
  memory of the other half) against recomputing a sliding window for every token (the paper's evaluation
  speed-up), attention lengths 128 ... 1024, batch 1; a third side is `transformers-xl evaluate`'s loop
  (`training.evaluate.evaluate_stream`: the memory in a `MemoryCache`, the loss of every prediction) over the
  same stream;
- `deploy`: batch 1, one segment of 128 tokens after 128 of memory (the issue configuration with mem_len 128): our
  eager forward (the memory as a legacy `mems` tuple, and carried from call to call in a `MemoryCache`, as a stream
  is read) against ONNX Runtime running the graph `torch.onnx.export(..., dynamo=True)` made of it (needs
  onnx, onnxscript, onnxruntime; CPU only), torch.compile, int8 (`quantize_dynamic_int8`, needs torchao) and bf16
  weights; then greedy decoding per token, eager against int8 and bf16 weights (see `measure_deploy`), there and
  at the shapes of the pretrained checkpoints, all their layers (`pretrained_decode_cases`);
- `peak`: the matmul peak itself (fp32 and bf16, best of several square products of several sizes), measured first
  and again last, the higher kept, and the memory bandwidth of a matrix-vector product (`generation` needs it).

Configurations: `issue` (d_model 512, 6 layers, 8 heads, d_inner 2048, vocabulary 32000, batch 4 x 512 tokens,
memory 512; Transformer-XL cutoffs [4000, 12000], div_val 1), `wt103` (transfo-xl-wt103's shapes, 2 of its 18
layers) and `xlnet-base` (xlnet-base-cased's shapes, 2 of its 12 layers), the default; `recipes`, the papers' real
sizes (`recipe_cases`: Transformer-XL WikiText-103 base and large, enwik8 12 layers, XLNet-base and -large as
sequence classifiers and permutation LMs; a batch per case that fits CPU memory, the recipes' on CUDA; throughput and
memory by default; NVIDIA's published one-A100 training figures beside ours where the recipe matches). Dropout 0
everywhere, so both sides compute the same thing in training mode. `--quick` uses one tiny configuration per model
(with `recipes`, tiny stand-ins of some recipes, `QUICK_RECIPES`). `--autocast bf16` runs every side's evaluation
and training under bf16 autocast (throughput and memory only); `benchmarks/gpu_session.sh` is a GPU session's one
command.

Method (shared/reference/performance-notes.md, Sec. 4): warm-up calls first (`--warmup`, default 2 per side), then
`--rounds` rounds (default 5) that alternate the sides (A, B, B, A, ...); each side's min and median, and ratios of
the medians.
2 threads by default (`--threads`, for this process and every worker: the only place the benchmarks set torch's
thread count). Writes DIR/results.json (every measurement) and DIR/results.md (the tables the README shows), after every
case and at the end (`finished`); default DIR: benchmark-results.
"""

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext, redirect_stdout
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from devices import (
    ATTENTION_IMPLEMENTATIONS,
    attention_implementation,
    cpu_model,
    device_name,
    parse_device,
    peak_memory,
    synchronize,
)
from timing import LEGACY_PYTHON_ENV, Worker, WorkerError, alternate, legacy_python, seconds, serve, summary

ROOT = Path(__file__).resolve().parents[1]
# glibc keeps freed blocks below a (growing) threshold for reuse, so the resident size of a process says little about
# its tensors; a fixed threshold of 64 KiB makes every larger allocation its own mapping, returned when freed.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "131072"}
# --keep-freed-memory: the opposite, for speed. glibc maps every block of more than 32 MiB (less, before its threshold
# has grown) from the kernel and unmaps it when freed, so every large tensor of every call is paid for again in page
# faults; with no mappings and no trimming, freed memory stays in the heap and is reused (the resident size stays at
# its high-water mark, as with a GPU's caching allocator).
KEEP_FREED_MEMORY_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 46)}


@dataclass
class Case:
    """One model configuration with its input shape and task: "lm" (a segment after the memory, every token
    predicted), "classification" (XLNet's sequence classification fine-tuning, no memory) or "plm" (XLNet's permutation
    LM: two streams, `num_predict` targets in a random factorisation order, no memory)."""

    name: str
    model: str  # "transfo-xl" or "xlnet"
    config: dict
    batch: int = 4
    length: int = 512
    task: str = "lm"
    num_predict: int = 0  # (plm)
    cuda_batch: int | None = None  # the batch on --device cuda, where it differs
    nvidia_a100: int | None = None  # NVIDIA's published training tokens/s of this recipe on one A100 (see recipe_cases)
    zipf: bool = False  # tokens drawn by Zipf's law over the ids (a vocabulary sorted by frequency), else uniformly
    evaluate_loss: bool = False  # evaluation times the loss of every target (eval.py's), else the full output

    @property
    def memory_length(self) -> int:
        return (self.config.get("mem_len") or 0) if self.task == "lm" else 0

    @property
    def reference(self):
        return "legacy" if self.model == "transfo-xl" else "transformers"

    @property
    def reference_name(self):
        return "transformers 4.37.2" if self.model == "transfo-xl" else "transformers 5"


def hub_shape(name, **overrides):
    config = json.loads((ROOT / "hub_configs" / name / "config.json").read_text())
    for key in ("architectures", "model_type", "task_specific_params"):
        config.pop(key, None)
    return {**config, "dropout": 0.0, **overrides}


ISSUE_TRANSFO_XL = dict(
    vocab_size=32000, cutoffs=[4000, 12000], div_val=1, d_model=512, d_embed=512, n_head=8, d_head=64,
    d_inner=2048, n_layer=6, mem_len=512, dropatt=0.0, eos_token_id=None, dropout=0.0,
)  # fmt: skip
ISSUE_XLNET = dict(vocab_size=32000, d_model=512, n_layer=6, n_head=8, d_inner=2048, mem_len=512, dropout=0.0)
CASES = {
    "issue": [Case("issue", "transfo-xl", ISSUE_TRANSFO_XL), Case("issue", "xlnet", ISSUE_XLNET)],
    "wt103": [Case("wt103, 2 layers", "transfo-xl", hub_shape("transfo-xl-wt103", n_layer=2, mem_len=512, dropatt=0))],
    "xlnet-base": [Case("xlnet-base, 2 layers", "xlnet", hub_shape("xlnet-base-cased", n_layer=2, mem_len=512))],
}
CONFIGS = [*CASES, "recipes"]  # (`recipes`: `recipe_cases`, made where transformers_xl can be imported)
# NVIDIA's published training throughput of the same recipes on one A100 80GB, mixed precision, tokens/s
# (DeepLearningExamples, PyTorch/LanguageModeling/Transformer-XL; the large one at batch 16): a column of the
# throughput table on --device cuda (on a CPU the ratio says nothing).
NVIDIA_A100 = {"wt103 base": 59_961, "wt103 large": 25_084}


def recipe_cases() -> list[Case]:
    """The papers' real sizes (issue 47), with the model of `training.recipes` where the recipe is there: Transformer-XL
    on WikiText-103, base (NVIDIA's: 16 layers, d_model 512, 8 heads, d_inner 2048, div_val 1, segment 192 + memory 192)
    and large (the `wt103` recipe: 18 layers, d_model 1024, 16 heads, d_inner 4096, div_val 4, 384 + 384), both with
    the adaptive softmax over 267,735 words (cutoffs [20000, 40000, 200000]); enwik8 with 12 layers (the `enwik8`
    recipe's model at its base size: d_model 512, 8 heads, d_inner 2048, 512 + 512, 204 characters); XLNet-base and
    XLNet-large (xlnet-base-cased's and xlnet-large-cased's shapes, sequence 512) fine-tuned as sequence classifiers
    and in the permutation LM (85 targets). Dropout 0, so both sides compute the same thing in training mode. The
    word-level tokens follow Zipf's law (`random_tokens`), as the adaptive softmax meets them in the corpus, and the
    evaluation is the papers' (`evaluate_loss`): the loss of every target, not 267,735 log-probabilities a token.
    `batch` fits ours and the reference (both held at once) in 24 GiB of CPU memory, fp32 with AdamW's state;
    `cuda_batch` is the recipes' (NVIDIA's per-GPU batch for WikiText-103, the paper's 22 for enwik8) or, for XLNet,
    what fits both sides in an H200's memory."""
    from transformers_xl.training.recipes import RECIPES

    def transfo_xl(recipe, segment, **size):
        return {**RECIPES[recipe].model, "vocab_size": RECIPES[recipe].reference_vocab_size, **size,
                "mem_len": segment, "dropout": 0.0, "dropatt": 0.0}  # fmt: skip

    base = dict(n_layer=16, d_model=512, d_embed=512, n_head=8, d_head=64, d_inner=2048, div_val=1)
    enwik8 = dict(n_layer=12, d_model=512, d_embed=512, n_head=8, d_head=64, d_inner=2048)
    xlnet = {name: hub_shape(f"{name}-cased", num_labels=2) for name in ("xlnet-base", "xlnet-large")}
    cases = [
        Case("wt103 base", "transfo-xl", transfo_xl("wt103", 192, **base), batch=4, length=192, cuda_batch=32,
             nvidia_a100=NVIDIA_A100["wt103 base"], zipf=True),
        Case("wt103 large", "transfo-xl", transfo_xl("wt103", 384), batch=1, length=384, cuda_batch=16,
             nvidia_a100=NVIDIA_A100["wt103 large"], zipf=True),
        Case("enwik8 12 layers", "transfo-xl", transfo_xl("enwik8", 512, **enwik8), batch=8, length=512, cuda_batch=22),
        Case("xlnet-base classification", "xlnet", xlnet["xlnet-base"], batch=8, task="classification", cuda_batch=32),
        Case("xlnet-base permutation LM", "xlnet", xlnet["xlnet-base"], batch=2, task="plm", num_predict=85,
             cuda_batch=16),
        Case("xlnet-large classification", "xlnet", xlnet["xlnet-large"], batch=2, task="classification",
             cuda_batch=16),
        Case("xlnet-large permutation LM", "xlnet", xlnet["xlnet-large"], batch=1, task="plm", num_predict=85,
             cuda_batch=8),
    ]  # fmt: skip
    return [replace(case, evaluate_loss=True) for case in cases]


# --quick --configs recipes: one tiny stand-in per model and task, the adaptive softmax with div_val 4 among them.
QUICK_RECIPES = ("wt103 large", "xlnet-base classification", "xlnet-base permutation LM")


def tiny(case: Case) -> Case:
    """`case` at --quick's size: 2 layers of width 64 (div_val 4's last cluster keeps a width of 1), a vocabulary of
    1000 (its cutoffs as many, in proportion), batch 2 x 16 tokens, memory 16, 4 targets; the structure (task,
    adaptive softmax, div_val) kept."""
    config = dict(case.config, n_layer=2, d_model=64, n_head=4, d_head=16, d_inner=128)
    if case.model == "transfo-xl":
        config["d_embed"] = 64
    if config["vocab_size"] > 1000:
        scale = 1000 / config["vocab_size"]
        config.update(vocab_size=1000, cutoffs=[round(cutoff * scale) for cutoff in config.get("cutoffs") or []])
    if config.get("mem_len"):
        config["mem_len"] = 16
    return replace(case, config=config, batch=2, length=16, num_predict=min(case.num_predict, 4), cuda_batch=None)


def chosen_cases(configs: list[str], quick: bool) -> list[Case]:
    """The cases of `configs`; with --quick the tiny ones (QUICK_CASES for the small configurations, `tiny` stand-ins
    of QUICK_RECIPES for `recipes`)."""
    cases = []
    if quick and set(configs) - {"recipes"}:
        cases += QUICK_CASES
    for name in configs:
        if name == "recipes":
            recipes = recipe_cases()
            cases += [tiny(case) for case in recipes if case.name in QUICK_RECIPES] if quick else recipes
        elif not quick:
            cases += CASES[name]
    return cases


QUICK_CASES = [
    Case("tiny", "transfo-xl", dict(ISSUE_TRANSFO_XL, vocab_size=1000, cutoffs=[200, 600], d_model=32, d_embed=32,
                                    n_head=4, d_head=8, d_inner=64, n_layer=2, mem_len=16), batch=2, length=16),
    Case("tiny", "xlnet", dict(ISSUE_XLNET, vocab_size=1000, d_model=32, n_head=4, d_inner=64, n_layer=2, mem_len=16),
         batch=2, length=16),
]  # fmt: skip
WORKLOADS = ["peak", "throughput", "memory", "bf16", "compile", "generation", "static", "stream", "deploy"]
# Those that --autocast bf16 applies to (every side's calls autocast), and --configs recipes' default.
AUTOCAST_WORKLOADS = ["peak", "throughput", "memory"]
# The deploy workload (issue 22): one segment of 128 tokens after 128 of memory, batch 1, as a deployed model reads a
# stream; the sides (Session.variant), eager first (the ratios are against it). "eager, cache" carries the memory from
# call to call in a MemoryCache, as a stream is read in eager mode (`transformers-xl evaluate`'s loop).
DEPLOY_SIDES = ["eager", "eager, cache", "onnxruntime", "compiled", "int8", "bf16 weights"]
DECODE_SIDES = ["eager", "int8", "bf16 weights"]
# Seconds between two deploy calls. ONNX Runtime's threads spin for milliseconds after a call returns, and slow
# whatever runs next on the machine's cores: our eager segment took 98-111 ms right after ONNX Runtime's call in one
# process, 79-80 ms after a 50 ms pause or with the spinning turned off (AMD EPYC, 2 cores, XLNet's deploy case).
DEPLOY_PAUSE = 0.05
# Decoding calls are short and per-token times on these shared machines move by a third from minute to minute: they
# alternate this many times the rounds of the segment.
DECODE_ROUNDS = 3
PRETRAINED_DECODE = "greedy decoding at a pretrained shape, prompt 64, batch 1"


def deploy_cases(quick: bool) -> list[Case]:
    cases = QUICK_CASES if quick else CASES["issue"]
    mem_len = 16 if quick else 128
    return [Case(c.name, c.model, dict(c.config, mem_len=mem_len), batch=1, length=mem_len) for c in cases]


def pretrained_decode_cases(quick: bool) -> list[Case]:
    """Decoding alone at the shapes of transfo-xl-wt103 and xlnet-base-cased, all their layers (random weights):
    a step there reads far more weight bytes than its fixed work per step costs, as a deployed model's does
    (transfo-xl-wt103: 285M parameters, 1.1 GB a token in fp32; the issue configuration's 37M read 140 MB), so the
    bf16 and int8 ratios show what fewer bytes buy. None with --quick: the tiny deploy cases stand for them (their
    workers decode again for these rows, `measure_deploy`)."""
    if quick:
        return []
    shapes = {"transfo-xl": hub_shape("transfo-xl-wt103", dropatt=0.0), "xlnet": hub_shape("xlnet-base-cased")}
    return [Case(f"{name} shape", model, dict(shapes[model], mem_len=128), batch=1, length=16)
            for name, model in (("transfo-xl-wt103", "transfo-xl"), ("xlnet-base-cased", "xlnet"))]  # fmt: skip


# Square sizes of the matmul peak, by device type and --quick: MKL's fp32 kernels peak anywhere from 1024 to 4096 on
# these CPUs; a GPU needs larger products to fill its units.
PEAK_SIZES = {"cpu": {False: (1024, 2048, 4096), True: (256, 512)},
              "cuda": {False: (4096, 8192, 16384), True: (256, 512)}}  # fmt: skip
# Bytes of the matrix-vector bandwidth's fp32 matrix, by device type and --quick: far beyond the caches (a CPU's L3,
# a GPU's L2).
GEMV_BYTES = {"cpu": {False: 64 * 2**20, True: 8 * 2**20}, "cuda": {False: 1024 * 2**20, True: 8 * 2**20}}
MODEL_NAMES = {"transfo-xl": "Transformer-XL", "xlnet": "XLNet"}


# ----------------------------------------------------------------------------------------------------------------
# One implementation, in this process or in a worker


def our_classes(model_type: str, task: str = "lm"):
    """(config class, model class) of ours for a case's model type ("transfo-xl" or "xlnet") and task (the LM head,
    or XLNet's sequence classifier for "classification")."""
    import transformers_xl

    prefix = {"transfo-xl": "TransfoXL", "xlnet": "XLNet"}[model_type]
    head = "ForSequenceClassification" if task == "classification" else "LMHeadModel"
    return getattr(transformers_xl, f"{prefix}Config"), getattr(transformers_xl, f"{prefix}{head}")


def load_model(folder: Path, implementation: str, device="cpu", attn_implementation="sdpa"):
    """Ours, transformers 5's XLNet or transformers 4.37.2's Transformer-XL (run under the legacy python), of the
    class the folder's config names (`write_case_folder`), on `device`, with `attn_implementation` where the model
    supports it (`devices.attention_implementation`)."""
    architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
    if implementation == "ours":
        import transformers_xl as library
    elif implementation in ("transformers", "legacy"):  # (the legacy one under the legacy venv's python)
        import transformers as library
    else:
        raise ValueError(f"implementation must be 'ours', 'transformers' or 'legacy', got {implementation!r}")
    model_class = getattr(library, architecture)
    attention = attention_implementation(model_class, attn_implementation)
    return model_class.from_pretrained(folder, attn_implementation=attention).to(device).eval()


class Session:
    """One implementation loaded from a case folder onto a device, answering measurement requests ({"op": ...}:
    `describe`, `time`, `logits`, `peak_memory`, `deploy_logits`, `decode`), the same in this process and in a
    worker."""

    def __init__(self, folder: Path, implementation: str, device="cpu", attn_implementation="sdpa", autocast=False):
        self.device = torch.device(device)
        self.autocast = autocast  # every evaluation and training call under bf16 autocast (--autocast bf16)
        self.model = load_model(folder, implementation, self.device, attn_implementation)
        if autocast and implementation == "legacy":
            embedding_without_autocast(self.model.transformer.word_emb)
        inputs = {name: value.to(self.device) if isinstance(value, torch.Tensor) else value
                  for name, value in torch.load(folder / "inputs.pt", weights_only=True).items()}  # fmt: skip
        self.input_ids, self.labels = inputs["input_ids"], inputs["labels"]
        self.scored = inputs.get("evaluate_loss", False)  # (Case.evaluate_loss: the timed evaluation is the loss)
        self.mems = tuple(mem.to(self.device) for mem in inputs["mems"])
        # (XLNet's LM keeps the memory it reads; the permutation LM's two streams read perm_mask and target_mapping)
        self.extra = {"use_mems": True} if self.model.config.model_type == "xlnet" and self.mems else {}
        self.extra.update({name: inputs[name] for name in ("perm_mask", "target_mapping") if name in inputs})
        self.optimizer = None
        self.compiled = None
        self.deployed = {}  # the deploy workload's variants, made on first use

    def ask(self, request: dict) -> dict:
        if request["op"] == "describe":  # (what the side runs: the legacy config may lack _attn_implementation)
            return {"attn_implementation": getattr(self.model.config, "_attn_implementation", "eager")}
        if request["op"] == "time":
            evaluation = self.evaluate_loss if self.scored else self.evaluate
            workloads = {"eval": evaluation, "train": self.forward_backward, "step": self.train_step}
            workload = workloads[request["workload"]]
            variant = self.variant(request.get("variant", "eager"))
            return {"seconds": seconds(workload, variant, device=self.device)}
        if request["op"] == "logits":
            torch.save(self.evaluate(self.model).float().cpu(), request["path"])
            return {}
        if request["op"] == "peak_memory":
            return {"bytes": self.peak_memory()}
        if request["op"] == "deploy_logits":  # (the deploy variant's log-probabilities against eager's)
            expected = self.evaluate(self.model).float()
            actual = self.evaluate(self.variant(request["variant"])).float()
            return {"max_abs_diff": (actual - expected).abs().max().item()}
        if request["op"] == "decode":
            return {"seconds": self.decode(self.variant(request["variant"]), request["new_tokens"])}
        raise ValueError(f"unknown request {request}")

    def variant(self, name):
        """A callable model: the model itself, the model under bf16 autocast, or `torch.compile(model)`."""
        if name == "eager":
            return self.model
        if name == "bf16":
            def autocast(*args, **kwargs):
                with torch.autocast(self.device.type, dtype=torch.bfloat16):
                    return self.model(*args, **kwargs)

            return autocast
        if name == "compiled":
            if self.compiled is None:  # (a compiled module has no truth value: it forwards len() to the model)
                self.compiled = torch.compile(self.model)
            return self.compiled
        if name in DEPLOY_VARIANTS:
            if name not in self.deployed:
                self.deployed[name] = DEPLOY_VARIANTS[name](self)
            return self.deployed[name]
        raise ValueError(f"variant must be 'eager', 'bf16', 'compiled' or one of {list(DEPLOY_VARIANTS)}, got {name!r}")

    def decode(self, model, new_tokens):
        """Seconds per new token of greedy decoding from a 64-token prompt, batch 1 (bench_generation's clock)."""
        from bench_generation import make_generate, random_prompt, seconds_per_token

        extra = {"use_mems": True} if self.extra else {"attention_mask": None}
        prompt = random_prompt(64, self.model.config.vocab_size, self.device)
        return seconds_per_token(make_generate(model, True, **extra), prompt, new_tokens)

    def evaluate(self, model):
        """Log-probabilities of the second segment after the memory, the classes' logits or the permutation LM's
        targets' (inference mode)."""
        self.model.eval()
        mems = tuple(mem.to(getattr(model, "dtype", torch.float32)) for mem in self.mems)  # (bf16 weights: bf16 mems)
        with torch.inference_mode(), self.precision():
            output = model(self.input_ids, mems=mems or None, **self.extra)
        return output["logits"] if "logits" in output else output["prediction_scores"]  # (the legacy model's name)

    def evaluate_loss(self, model):
        """The loss of every target (inference mode), as the papers evaluate (eval.py): the adaptive softmax scores
        each target's cluster only, where `evaluate` makes the whole vocabulary's log-probabilities."""
        self.model.eval()
        with torch.inference_mode(), self.precision():
            return model(self.input_ids, mems=self.mems or None, labels=self.labels, **self.extra).loss

    def forward_backward(self, model):
        self.model.train()
        with self.precision():
            loss = model(self.input_ids, mems=self.mems or None, labels=self.labels, **self.extra).loss
        loss.backward()

    def precision(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast)

    def train_step(self, model):
        self.optimizer = self.optimizer or torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.forward_backward(model)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def peak_memory(self):
        """Bytes a training step adds at its peak (`devices.peak_memory`): activations, gradients and temporaries.
        Measured on the second step (the first one creates AdamW's state, which then stays like the weights). On
        CPU run in a fresh worker with `MALLOC_ENV`, so that freed memory leaves the resident set."""
        self.train_step(self.model)
        return peak_memory(lambda: self.train_step(self.model), self.device)


def embedding_without_autocast(embedding):
    """transformers 4.37.2's adaptive embedding, run with autocast off: it copies each cluster's projected embeddings
    into an fp32 tensor (`index_copy_`), which fails when autocast has made them bf16. The least change that runs
    that reference under autocast (the rest of it autocasts; the embedding's projections are a negligible part of a
    step)."""
    forward = embedding.forward

    def without_autocast(input_ids):
        with torch.autocast(input_ids.device.type, enabled=False):
            return forward(input_ids)

    embedding.forward = without_autocast


def int8_model(session):
    """int8 linear layers (`quantize_dynamic_int8`: torchao's, imported here so that the command runs without it;
    `unmeasured_deploy_sides` leaves the int8 sides out where torchao is missing)."""
    from transformers_xl.modeling.quantization import quantize_dynamic_int8

    return quantize_dynamic_int8(session.model)


def bf16_model(session):
    import copy

    return copy.deepcopy(session.model).to(torch.bfloat16)


def streaming_model(session):
    """Our eager model reading a stream: the memory carried from call to call in a `MemoryCache` (started from the
    session's), which keeps the memory's keys and values and the projected position keys instead of projecting them
    again at every call as a legacy `mems` tuple has them; `mem_len` keeps the memory's length, so every call does
    the same work. A callable like the model (the given `mems` are the cache's)."""
    from transformers_xl.modeling.memory_cache import MemoryCache

    cache = MemoryCache.from_mems(session.mems, session.model.config.mem_len)

    def run(input_ids, mems, **extra):
        return session.model(input_ids, cache=cache, **extra)

    return run


def onnxruntime_model(session):
    """The model as an ONNX graph of (ids, memory) -> (log-probabilities, new memory), exported by
    `torch.onnx.export(..., dynamo=True)` at the session's input shapes and run by ONNX Runtime with the same number
    of threads; a callable like the model (the logits only)."""
    import onnxruntime

    class WithMemory(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *mems):
            output = self.model(input_ids, mems=mems, **session.extra)
            return output.logits, *output.mems

    path = Path(tempfile.mkdtemp(prefix="bench_onnx_")) / "model.onnx"
    with torch.inference_mode():
        torch.onnx.export(WithMemory(session.model).eval(), (session.input_ids, *session.mems), path, dynamo=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = torch.get_num_threads(), 1
    runtime = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [node.name for node in runtime.get_inputs()]

    def run(input_ids, mems, **_):
        inputs = [input_ids.numpy(), *(mem.numpy() for mem in mems)]
        return {"logits": torch.from_numpy(runtime.run(None, dict(zip(names, inputs)))[0])}

    return run


# The deploy workload's variants of our model (Session.variant), made in the worker that times them.
DEPLOY_VARIANTS = {"int8": int8_model, "bf16 weights": bf16_model, "onnxruntime": onnxruntime_model,
                   "eager, cache": streaming_model}  # fmt: skip


def worker_main(folder, implementation, threads, device, attn_implementation, autocast):
    torch.set_num_threads(threads)
    # torch.compile compiles afresh: its on-disk caches would serve a graph compiled before a change to one of our
    # operators' backward (their key does not cover it), and a version's measurement would be another's.
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    with redirect_stdout(sys.stderr):  # (what loading prints, e.g. a library's import error, is not an answer)
        session = Session(Path(folder), implementation, device, attn_implementation, autocast == "bf16")
    serve(session.ask)


# ----------------------------------------------------------------------------------------------------------------
# The measurements


@dataclass
class Run:
    """What the command measured: `rows` (for results.json and the tables) and where it works."""

    args: argparse.Namespace
    workdir: Path
    rows: list = field(default_factory=list)
    peak_flops: dict = field(default_factory=dict)  # dtype -> the highest of peak_measurements
    peak_measurements: list = field(default_factory=list)
    gemv_measurements: list = field(default_factory=list)  # the matrix-vector bandwidth per thread count
    gemv_bandwidth: float = 0.0  # bytes/s, the best of the matrix-vector measurements

    def worker(self, folder, implementation, python=None, env=None):
        """A worker process for one side, on --threads threads, --device, --attn-implementation and --autocast;
        `env` (the memory measurement's) replaces --keep-freed-memory's."""
        python = python or sys.executable
        env = env or (KEEP_FREED_MEMORY_ENV if self.args.keep_freed_memory else None)
        args = (str(folder), implementation, str(self.args.threads), self.args.device, self.args.attn_implementation,
                self.args.autocast)  # fmt: skip
        return Worker(python, __file__, "--worker", *args, env=env)

    def add(self, section, case_name, model, workload, unit, sides, **extra):
        """One row: `sides` maps a side's name to a list of measurements, an error message or None (not
        measured); the ratio compares the first two (see `ratio`)."""
        row = dict(section=section, config=case_name, model=model, workload=workload, unit=unit,
                   sides={name: side_summary(v) for name, v in sides.items()}, **extra)  # fmt: skip
        row["ratio"] = ratio(row)
        self.rows.append(row)


def side_summary(values):
    if values is None:
        return {"status": "not measured"}
    if isinstance(values, str):
        return {"status": "failed", "error": values}
    return {"status": "measured", **summary(values)}


def measure_case(parser, args, case: Case, measure, prefix: str):
    """What the one-case scripts (profile_step.py, memory_breakdown.py) share: `measure(folder)` on `case`'s folder,
    written to a temporary folder here; for `--implementation legacy` the script runs again under the legacy venv's
    python with `--folder` (its hidden option), where `measure` reads the same folder."""
    if args.folder:
        return measure(Path(args.folder))
    folder = Path(tempfile.mkdtemp(prefix=prefix)) / "case"
    write_case_folder(case, folder)
    if args.implementation != "legacy":
        return measure(folder)
    python = legacy_python(args.legacy_python)
    if not python:
        parser.error(f"--implementation legacy needs --legacy-python or ${LEGACY_PYTHON_ENV}")
    return subprocess.run([python, sys.argv[0], *sys.argv[1:], "--folder", str(folder)], check=True).returncode


def write_case_folder(case: Case, folder: Path):
    """config.json (naming the model's class) + pytorch_model.bin (every key, as transformers 4.x saved them) from our
    randomly initialised model, and inputs.pt: the second segment, the memory our model left after the first one
    (the "lm" task) and the labels: the segment itself (lm), random classes (classification) or the tokens of the
    last `num_predict` positions, predicted in a random order (plm, `bench_xlnet.plm_inputs`)."""
    config_class, model_class = our_classes(case.model, case.task)
    torch.manual_seed(0)
    model = model_class(config_class(**case.config)).eval()
    folder.mkdir(parents=True)
    model.config.architectures = [model_class.__name__]
    model.config.save_pretrained(folder)
    torch.save(getattr(model, "checkpoint_state_dict", model.state_dict)(), folder / "pytorch_model.bin")
    generator = torch.Generator().manual_seed(0)
    first, second = random_tokens(case, generator)
    inputs = {"input_ids": second, "labels": second, "mems": [], "evaluate_loss": case.evaluate_loss}
    if case.memory_length:  # (the base model's: the output layer's logits, up to GBs at the recipes' sizes, unmade)
        with torch.inference_mode():
            body = model.transformer(first, **({"use_mems": True} if case.model == "xlnet" else {}))
        inputs["mems"] = list(body.mems)
    if case.task == "classification":
        inputs["labels"] = torch.randint(0, model.config.num_labels, (case.batch,), generator=generator)
    if case.task == "plm":
        from bench_xlnet import plm_inputs

        inputs["perm_mask"], inputs["target_mapping"] = plm_inputs(case.batch, case.length, case.num_predict, generator)
        inputs["labels"] = second[:, -case.num_predict :].clone()
    torch.save(inputs, folder / "inputs.pt")


def random_tokens(case: Case, generator) -> torch.Tensor:
    """Two segments of [batch, length] token ids: uniform, or with `case.zipf` the id of rank r drawn with probability
    proportional to 1 / (r + 1), as the words of a corpus whose vocabulary is sorted by frequency. What the adaptive
    softmax costs depends on it: over WikiText-103's 267,735 words, Zipf's law puts 80% of the targets in the
    20,000-word head cluster (most of the corpus's are there), uniform draws 7.5% (and 60% in the 160,000-word tail)."""
    shape, vocab_size = (2, case.batch, case.length), case.config["vocab_size"]
    if not case.zipf:
        return torch.randint(0, vocab_size, shape, generator=generator)
    weights = 1 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    draws = torch.multinomial(weights, 2 * case.batch * case.length, replacement=True, generator=generator)
    return draws.view(shape)


def ideal_forward_flops(case: Case, labels: torch.Tensor | None = None) -> float:
    """GEMM FLOPs an ideal implementation spends on one evaluation call (performance-notes.md, Sec. 4): per layer
    the query and output projections of its queries, key / value projections of all k = memory + q tokens, the
    relative position keys projected once for the R distances (R = k for Transformer-XL, k + q for XLNet), the
    content, position and value products over (query, k) pairs and the feed-forward; then the output layer over every
    token (lm), every target (plm) or the summary and classifier of each sequence (classification), each cluster of
    the adaptive softmax with its width and projection. The queries: the q new tokens, and the permutation LM's query
    stream (one per target); in the last layer only those the output reads (every token for lm, the query stream for
    plm, the summarised last token for classification). Given the `labels` of an evaluation of the loss
    (`evaluate_loss`), a tail cluster of the adaptive softmax scores only the positions whose target is in it."""
    c, b, q = case.config, case.batch, case.length
    k = case.memory_length + q
    distances = k + q if case.model == "xlnet" else k
    d, inner, heads = c["d_model"], c["d_inner"], c["n_head"] * c.get("d_head", c["d_model"] // c["n_head"])

    def layer(queries):
        return (4 * b * queries * d * heads + 4 * b * k * d * heads + 2 * distances * d * heads
                + 6 * b * queries * k * heads + 4 * b * queries * d * inner)  # fmt: skip

    last = {"lm": q, "plm": case.num_predict, "classification": 1}[case.task]
    layers = (c["n_layer"] - 1) * layer(q + case.num_predict) + layer(last)
    vocab = c["vocab_size"]
    if case.task == "classification":
        head = 2 * b * d * (d + c["num_labels"])
    elif case.model == "xlnet" or not c.get("cutoffs"):
        head = 2 * b * (case.num_predict or q) * d * vocab
    else:
        ends = [0, *c["cutoffs"], vocab]
        targets = None if labels is None else labels[:, 1:]  # (position t predicts token t + 1)
        head = 0
        for i in range(len(ends) - 1):
            width = c.get("d_embed", d) // c.get("div_val", 1) ** i
            rows = ends[i + 1] - ends[i] + (len(ends) - 2 if i == 0 else 0)  # the head also scores the clusters
            if targets is None:
                scored = b * q
            else:
                scored = targets.numel() if i == 0 else int(((targets >= ends[i]) & (targets < ends[i + 1])).sum())
            head += 2 * scored * rows * width + (2 * scored * d * width if width != d else 0)
    return layers + head


def matmul_peak(dtype, size, device, calls=5):
    """FLOP/s of the best of `calls` square products of `size` into one preallocated output on `device`, after three
    warm-up calls. (A fresh output per call would measure its page faults and the allocator, not the machine.)"""
    a, b = (torch.randn(size, size).to(device, dtype) for _ in range(2))
    out = torch.empty(size, size, dtype=dtype, device=device)

    def product():
        torch.mm(a, b, out=out)

    for _ in range(3):
        product()
    return 2 * size**3 / min(seconds(product, device=device) for _ in range(calls))


def measure_peak(run: Run, when: str):
    """The device's matmul peak per dtype: the best over several sizes, measured at the start of the run and again
    at its end, the higher kept. A peak that a moment of load pulled down would flatter the fraction of it that the
    models reach (one such first measurement read 192 GFLOP/s on a machine whose products reach 320). Then the
    matrix-vector bandwidth, on --threads threads."""
    device, sizes = run.args.device, PEAK_SIZES[torch.device(run.args.device).type][run.args.quick]
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        best = max((matmul_peak(dtype, size, device), size) for size in sizes)
        run.peak_measurements.append({"when": when, "dtype": name, "flops": best[0], "size": best[1]})
        run.peak_flops[name] = max(run.peak_flops.get(name, 0.0), best[0])
        print(f"matmul peak {name} ({when}, best at {best[1]}x{best[1]}): {best[0] / 1e9:.0f} GFLOP/s")
    bandwidth = gemv_bandwidth(GEMV_BYTES[torch.device(device).type][run.args.quick] // 2048, device)
    run.gemv_measurements.append({"when": when, "threads": run.args.threads, "bytes_per_second": bandwidth})
    run.gemv_bandwidth = max(run.gemv_bandwidth, bandwidth)
    print(f"matrix-vector bandwidth, fp32 ({when}): {bandwidth / 1e9:.1f} GB/s")


def gemv_bandwidth(rows, device, calls=5):
    """Bytes/s of the best of `calls` products of a [rows, 512] fp32 matrix with one vector on `device`, asked both
    ways (`x W^T`, as `F.linear` does, and `(W x^T)^T`: BLAS libraries serve them at different speeds), after warm-up:
    how fast the device streams weights from memory, which bounds a decoding step."""
    weight, vector = torch.randn(rows, 512, device=device), torch.randn(1, 512, device=device)
    best = 0.0
    for product in (lambda: torch.nn.functional.linear(vector, weight), lambda: torch.mm(weight, vector.T).T):
        for _ in range(2):
            product()
        seconds_per_call = min(seconds(product, device=device) for _ in range(calls))
        best = max(best, weight.numel() * weight.element_size() / seconds_per_call)
    return best


def reference_worker(run: Run, case: Case, folder: Path):
    """The reference side's worker: transformers' XLNet under this python, legacy Transformer-XL under the legacy
    venv's (None without one)."""
    if case.reference == "transformers":
        return run.worker(folder, "transformers")
    python = legacy_python(run.args.legacy_python)
    return run.worker(folder, "legacy", python) if python else None


def measure_throughput(run: Run, case: Case, folder: Path, memory: bool = False):
    """Parity, then evaluation / training / training step, ours and the reference alternating, each side in a
    worker process of its own: in one process the sides would share one heap, and each side's speed would depend
    on what the other's calls left in it (glibc's thresholds move with the blocks freed; transformers 5's XLNet
    measured 257 to 349 training tokens/s from run to run beside ours). A side that fails (out of memory, say)
    fails the case's remaining rows with its error, the other side's are not measured, and the run goes on. With
    `memory`, the memory workload is then measured in the same workers (`memory_in_timing_workers`)."""
    model, tokens = MODEL_NAMES[case.model], case.batch * case.length
    ours, reference = run.worker(folder, "ours"), reference_worker(run, case, folder)
    sides = {name: side for name, side in (("ours", ours), (case.reference_name, reference)) if side is not None}
    attention, parity, failed = {}, None, {}  # failed: side -> the first line of its error

    def ask(name, request):
        try:
            return sides[name].ask(request)
        except WorkerError as error:
            failed[name] = f"{error}".splitlines()[0][:300]
            raise

    try:
        attention = {name: ask(name, {"op": "describe"})["attn_implementation"] for name in sides}
        for name, implementation in attention.items():
            if implementation != run.args.attn_implementation:
                print(f"{case.name} {model}: {name} runs {implementation} attention ({run.args.attn_implementation} "
                      "is not supported by its model)")  # fmt: skip
        if reference is not None:
            logits = {}
            for index, name in enumerate(sides):
                logits[name] = folder / f"logits-{index}.pt"
                ask(name, {"op": "logits", "path": str(logits[name])})
            parity = (torch.load(logits[case.reference_name]) - torch.load(logits["ours"])).abs().max().item()
            print(f"{case.name} {model}: max |logit diff| ours vs {case.reference_name}: {parity:.2e}")
    except WorkerError:
        pass  # (in `failed`)
    evaluation = "evaluation (loss)" if case.evaluate_loss else "evaluation"
    labels = {"eval": evaluation, "train": "training forward + backward", "step": "training step (AdamW)"}
    for workload, label in labels.items():
        request = {"op": "time", "workload": workload}
        runs = {name: (lambda name=name: ask(name, request)["seconds"]) for name in sides}
        if not failed:
            try:
                values = alternate(runs, run.args.rounds, warmup=run.args.warmup)
            except WorkerError:
                pass  # (in `failed`)
        if failed:
            values = {name: failed.get(name) for name in sides}
        values.setdefault(case.reference_name, None)
        extra = {"tokens": tokens, "attn_implementation": attention}
        if workload == "eval":
            targets = torch.load(folder / "inputs.pt")["labels"] if case.evaluate_loss else None
            extra.update(ideal_flops=ideal_forward_flops(case, targets), max_abs_logit_diff=parity)
        if workload == "step" and case.nvidia_a100:
            extra["nvidia_a100_tokens_per_second"] = case.nvidia_a100
        run.add("throughput", case.name, model, label, "s", values, **extra)
        print_row(run.rows[-1])
    if memory:
        measure_memory(run, case, folder, open_workers=sides)
    for side in sides.values():
        side.close()


def memory_in_timing_workers(args, workloads) -> bool:
    """Whether the memory workload asks the throughput's workers rather than fresh ones: on CUDA, where the allocator's
    peak counts the step's tensors whatever the process did before (and a fresh worker per side and case would cost
    the GPU session minutes), and with --quick, a smoke test (where a worker's start is most of the time); on CPU a
    fresh process with `MALLOC_ENV` is what makes its resident size a measure."""
    cuda = torch.device(args.device).type == "cuda"
    return "throughput" in workloads and "memory" in workloads and (cuda or args.quick)


def measure_memory(run: Run, case: Case, folder: Path, open_workers: dict | None = None):
    """Peak memory of a training step, each side in a fresh worker or, given `open_workers` ({side: worker}: the
    throughput's, see `memory_in_timing_workers`), in those."""
    sides, attention = {}, {}
    legacy = legacy_python(run.args.legacy_python)
    for name, implementation, python in (
        ("ours", "ours", None),
        (case.reference_name, case.reference, legacy if case.reference == "legacy" else None),
    ):
        if implementation == "legacy" and not python:
            sides[name] = None
            continue
        opened = (open_workers or {}).get(name)
        try:
            context = nullcontext(opened) if opened else run.worker(folder, implementation, python, env=MALLOC_ENV)
            with context as worker:
                attention[name] = worker.ask({"op": "describe"})["attn_implementation"]
                sides[name] = [worker.ask({"op": "peak_memory"})["bytes"]]
        except WorkerError as error:
            sides[name] = f"{error}".splitlines()[0][:300]  # (a table cell's line)
    run.add("memory", case.name, MODEL_NAMES[case.model], "training step, peak above the trained model", "bytes", sides,
            attn_implementation=attention)  # fmt: skip
    print_row(run.rows[-1])


def measure_variants(run: Run, case: Case, folder: Path, variant: str):
    """Ours in bf16 autocast or compiled against ours in fp32 eager, alternating, each workload in a worker of its own
    (a compiler crash cannot end the run; with --quick both in one)."""
    model = MODEL_NAMES[case.model]
    labels = {"eval": "evaluation", "train": "training forward + backward"}
    shared = run.worker(folder, "ours") if run.args.quick else None
    for workload, label in labels.items():
        sides, compile_seconds = {}, None
        session = shared or run.worker(folder, "ours")
        eager, other = ({"op": "time", "workload": workload, "variant": v} for v in ("eager", variant))
        try:
            if variant == "compiled":  # the first call compiles
                compile_seconds = session.ask(other)["seconds"]
            sides = alternate(  # the variant first: the ratio is then its speed-up over fp32 eager
                {variant: lambda: session.ask(other)["seconds"], "fp32 eager": lambda: session.ask(eager)["seconds"]},
                run.args.rounds,
                warmup=run.args.warmup,
            )
        except WorkerError as error:
            sides = {variant: f"{error}".splitlines()[0][:300], "fp32 eager": None}
        if session is not shared:
            session.close()
        run.add(variant, case.name, model, label, "s", sides, tokens=case.batch * case.length,
                first_call_seconds=compile_seconds)  # fmt: skip
        print_row(run.rows[-1])
    if shared is not None:
        shared.close()


def measure_generation(run: Run):
    """bench_generation.py's measurements (greedy decoding, batch 1), with the issue configuration's vocabulary
    split; mem_len 1600 so that the memory covers the prompts. Then ours at the shortest prompt against the
    weight-streaming floor."""
    import bench_generation
    import transformers_xl

    txl, xlnet, prompts, new_tokens = generation_setup(run)
    python = legacy_python(run.args.legacy_python)
    name = QUICK_CASES[0].name if run.args.quick else "issue"
    placement = {"device": run.args.device, "attn_implementation": run.args.attn_implementation}
    ours = {}  # model -> ours' seconds per token at the shortest prompt
    results, same = bench_generation.bench_transfo_xl(prompts, run.args.rounds, python, txl, new_tokens, **placement)
    for prompt, sides in results.items():
        sides = {side: sides.get(side) for side in ("ours (cache)", "legacy 4.37.2", "ours (recompute)")}
        run.add("generation", name, "Transformer-XL", f"prompt {prompt}", "s/token", sides, identical_tokens=same)
    ours["Transformer-XL"] = results[min(prompts)]["ours (cache)"]
    results, same = bench_generation.bench_xlnet(prompts, run.args.rounds, xlnet, new_tokens, **placement)
    for prompt, sides in results.items():
        run.add("generation", name, "XLNet", f"prompt {prompt}", "s/token", sides, identical_tokens=same)
    ours["XLNet"] = results[min(prompts)]["ours"]

    if not run.gemv_bandwidth:
        measure_peak(run, "for the floor")
    models = {"Transformer-XL": transformers_xl.TransfoXLLMHeadModel(transformers_xl.TransfoXLConfig(**txl)),
              "XLNet": transformers_xl.XLNetLMHeadModel(transformers_xl.XLNetConfig(**xlnet))}  # fmt: skip
    for model, module in models.items():
        weight_bytes = bench_generation.streamed_weight_bytes(module)
        floor = weight_bytes / run.gemv_bandwidth
        run.add("floor", name, model, f"greedy, prompt {min(prompts)}", "s/token",
                {"ours": ours[model], "weight-streaming floor": [floor]},
                weight_bytes=weight_bytes, gemv_bytes_per_second=run.gemv_bandwidth)  # fmt: skip
        print_row(run.rows[-1])


def measure_static_decoding(run: Run):
    """Decoding with the static cache and generate()'s compiled step against ours eager (default cache), for both
    models at the deploy workload's decoding shapes (mem_len 128, prompt 64; the issue configuration and the
    pretrained checkpoints' shapes, all their layers), fp32 and bf16 weights, with the first call's seconds
    (compilation included) and the time over the weight-streaming floor. --quick: the tiny configurations, fp32,
    not compiled (compiling takes seconds even there)."""
    import bench_generation

    if not run.gemv_bandwidth:
        measure_peak(run, "for the floor")
    cases = deploy_cases(run.args.quick) + pretrained_decode_cases(run.args.quick)
    dtypes = [torch.float32] if run.args.quick else [torch.float32, torch.bfloat16]
    prompt, new_tokens = (8, 4) if run.args.quick else (64, 12)
    for case in cases:
        config_class, model_class = our_classes(case.model)
        model = model_class(config_class(**case.config))
        fp32_bytes = bench_generation.streamed_weight_bytes(model)
        del model
        for dtype in dtypes:
            sides, first_call, same = bench_generation.bench_static(
                config_class, model_class, case.config, prompt, run.args.rounds, new_tokens, run.args.device, dtype,
                run.args.attn_implementation, compiled=not run.args.quick,
            )
            weight_bytes = fp32_bytes * torch.finfo(dtype).bits // 32
            run.add("static", case.name, MODEL_NAMES[case.model], f"{str(dtype).removeprefix('torch.')}, "
                    f"prompt {prompt}", "s/token", sides, first_call_seconds=first_call, identical_tokens=same,
                    compiled=not run.args.quick, floor_seconds=weight_bytes / run.gemv_bandwidth)  # fmt: skip
            print_row(run.rows[-1])


def generation_setup(run: Run):
    """(Transformer-XL config, XLNet config, prompt lengths, new tokens) of the generation workloads."""
    import bench_generation

    if run.args.quick:
        return dict(QUICK_CASES[0].config, mem_len=64), dict(QUICK_CASES[1].config, mem_len=None), [8], 4
    txl = dict(bench_generation.CONFIG, cutoffs=ISSUE_TRANSFO_XL["cutoffs"])
    return txl, bench_generation.XLNET_CONFIG, [64, 1024], 12


def measure_deploy(run: Run, case: Case, folder: Path, segment: bool = True, pretrained_shape: bool = False):
    """Our eager forward against ONNX Runtime running the exported graph, torch.compile, int8 (every linear layer,
    `quantize_dynamic_int8`) and bf16 weights, on one segment after the memory (`deploy_cases`), each side in a
    worker of its own (with --quick, a smoke test, all in one: a worker's start is most of a tiny side's time),
    alternating; each side's log-probabilities checked against eager's first (max |diff|, which also makes the
    variant: export, compilation, quantization). Then greedy decoding per token, eager against int8 and bf16
    weights: after the segment, and as the row of a pretrained shape (`pretrained_shape`: alone, without `segment`,
    at `pretrained_decode_cases`; with --quick the tiny case stands for them, in the same workers)."""
    model, sides = MODEL_NAMES[case.model], {}
    workers, differences = {}, {}
    left_out = unmeasured_deploy_sides(run.args)
    shared = run.worker(folder, "ours") if run.args.quick else None
    for side in DEPLOY_SIDES if segment else DECODE_SIDES:
        if side in left_out:
            continue
        worker = shared or run.worker(folder, "ours")
        try:
            if side != "eager":
                differences[side] = worker.ask({"op": "deploy_logits", "variant": side})["max_abs_diff"]
            workers[side] = worker
        except WorkerError as error:
            sides[side] = f"{error}".splitlines()[0][:300]
            if worker is not shared:
                worker.close()
    print(f"{case.name} {model}: max |log-probability diff| against eager: "
          + ", ".join(f"{side} {diff:.2e}" for side, diff in differences.items()))  # fmt: skip

    def timed(requests, rounds):
        """{name: seconds} of `requests` ({name: (side, request)}: the side's worker answers), alternating."""
        runs = {name: (lambda w=workers[side], r=request: w.ask(r)["seconds"])
                for name, (side, request) in requests.items()}  # fmt: skip
        try:  # (a pause before each call: ONNX Runtime's threads spin on after its calls, see DEPLOY_PAUSE)
            return alternate(runs, rounds, warmup=run.args.warmup, pause=DEPLOY_PAUSE)
        except WorkerError as error:
            return {name: f"{error}".splitlines()[0][:300] for name in requests}

    if segment:
        requests = {side: (side, {"op": "time", "workload": "eval", "variant": side}) for side in workers}
        values = {**sides, **timed(requests, run.args.rounds)}
        workload = f"segment {case.batch} x {case.length}, memory {case.config['mem_len']}"
        run.add("deploy", case.name, model, workload, "s", {side: values.get(side) for side in DEPLOY_SIDES},
                tokens=case.batch * case.length, max_abs_logit_diff=differences)  # fmt: skip
        print_row(run.rows[-1])
    new_tokens = 4 if run.args.quick else 16
    decoding = {side: (side, {"op": "decode", "variant": side, "new_tokens": new_tokens}) for side in workers
                if side in DECODE_SIDES}  # fmt: skip
    rows = [("greedy decoding, prompt 64, batch 1", None)] if segment else []
    if pretrained_shape:  # (its variants' differences: the decoding sides')
        rows.append((PRETRAINED_DECODE, {side: diff for side, diff in differences.items() if side in DECODE_SIDES}))
    for workload, row_differences in rows:
        values = {**sides, **timed(decoding, DECODE_ROUNDS * run.args.rounds)}
        run.add("deploy", case.name, model, workload, "s/token", {side: values.get(side) for side in DECODE_SIDES},
                max_abs_logit_diff=row_differences)  # fmt: skip
        print_row(run.rows[-1])
    for worker in [*workers.values(), shared]:
        if worker is not None:
            worker.close()


def unmeasured_deploy_sides(args) -> dict[str, str]:
    """The deploy workload's sides this run leaves out (reported as not measured), with the reason."""
    left_out = {}
    if args.quick:
        left_out["compiled"] = "minutes of compilation on CPU (as the compile workload), not in --quick"
    if torch.device(args.device).type != "cpu":
        left_out["onnxruntime"] = "ONNX Runtime runs the graph on CPU: measured with --device cpu"
    if importlib.util.find_spec("torchao") is None:
        left_out["int8"] = 'int8 (quantize_dynamic_int8) needs torchao: pip install "transformers-xl[torchao]"'
    return left_out


def per_token(function, device):
    """Seconds per token of a call that returns how many tokens it predicted, until `device` has run all of it."""
    synchronize(device)
    start = time.perf_counter()
    tokens = function()
    synchronize(device)
    return (time.perf_counter() - start) / tokens


def measure_stream(run: Run, case: Case, folder: Path):
    """Evaluation of a stream, batch 1: with the memory (segments of A/2 tokens attending to A/2 remembered ones,
    two segments per call after one that fills the memory) against a sliding window of A tokens run once per
    predicted token (the last position's log-probabilities only), for attention lengths A."""
    from transformers_xl.training.evaluate import evaluate_stream

    device = run.args.device
    model = load_model(folder, "ours", device, run.args.attn_implementation)
    lengths = [8, 16] if run.args.quick else [128, 256, 512, 1024]
    windows = 2  # sliding-window predictions per call
    for attention in lengths:
        segment = attention // 2
        model.config.mem_len = attention - segment
        stream = torch.randint(0, model.config.vocab_size, (1, 3 * segment), generator=torch.Generator().manual_seed(0))
        stream = stream.to(device)
        with torch.inference_mode():
            primed = model(stream[:, :segment]).mems

        def with_memory():
            with torch.inference_mode():
                mems = primed
                for chunk in stream[:, segment:].split(segment, dim=1):
                    mems = model(chunk, mems=mems).mems
            return 2 * segment

        def sliding_window():
            with torch.inference_mode():
                for end in range(stream.shape[1] - windows + 1, stream.shape[1] + 1):
                    model(stream[:, end - attention : end], logits_to_keep=1)
            return windows

        def evaluate_command():  # (from an empty memory: its first segment, cheaper, is among its predictions)
            result = evaluate_stream(model, stream[0], batch_size=1, tgt_len=segment, mem_len=attention - segment,
                                     clamp_len=-1, same_length=False, progress=False)  # fmt: skip
            return result["predicted_tokens"]

        sides = alternate(
            {"with memory": lambda: per_token(with_memory, device),
             "sliding window": lambda: per_token(sliding_window, device),
             "evaluate (cache)": lambda: per_token(evaluate_command, device)},
            run.args.rounds,
            warmup=run.args.warmup,
        )  # fmt: skip
        run.add("stream", case.name, "Transformer-XL", f"attention length {attention}", "s/token", sides)
        print_row(run.rows[-1])


# ----------------------------------------------------------------------------------------------------------------
# Reports


def rate(side, row):
    """Throughput at the median and at the best call (tokens/s, or new tokens/s), or the figure itself."""
    if row["unit"] == "s":
        return row["tokens"] / side["median"], row["tokens"] / side["min"]
    if row["unit"] in ("s/token",):
        return 1 / side["median"], 1 / side["min"]
    return side["median"], side["min"]


def ratio(row):
    """Of the first two sides (ours, or the variant measured): first / second for memory (lower is better), second /
    first for times (the first side's speed-up)."""
    ours, other = list(row["sides"].values())[:2]
    if ours["status"] != "measured" or other["status"] != "measured":
        return None
    numerator, denominator = (ours, other) if row["unit"] == "bytes" else (other, ours)
    return numerator["median"] / denominator["median"] if denominator["median"] else None


def cell(side, row):
    if side["status"] == "not measured":
        return "not measured"
    if side["status"] == "failed":
        return f"failed: {side['error']}"
    if row["unit"] == "bytes":
        mib = side["median"] / 2**20
        return f"{mib:,.0f} MiB" if mib >= 10 else f"{mib:.2f} MiB"
    median, best = rate(side, row)
    return f"{median:,.0f} / {best:,.0f}" if median >= 100 else f"{median:,.1f} / {best:,.1f}"


def print_row(row):
    cells = " | ".join(f"{name}: {cell(side, row)}" for name, side in row["sides"].items())
    r = row["ratio"]
    ratio_text = "" if r is None else f" | {r:.2f}x"
    print(f"[{row['section']}] {row['config']} {row['model']} {row['workload']}: {cells}{ratio_text}")


SECTIONS = {
    "throughput": ("Throughput ({precision}): tokens/s, median / best call; speed-up = reference time / ours (medians)",
                   ["configuration", "model", "workload", "ours", "reference", "speed-up", "ours, % of matmul peak"]),
    "memory": ("Peak memory of a training step ({precision}, above the trained model); ratio = ours / reference",
               ["configuration", "model", "workload", "ours", "reference", "ours / reference"]),
    "bf16": ("bf16 autocast against our own fp32: tokens/s, median / best; speed-up over fp32",
             ["configuration", "model", "workload", "ours bf16", "ours fp32", "speed-up"]),
    "compiled": ("torch.compile(model) against eager, ours, fp32: tokens/s, median / best; speed-up over eager",
                 ["configuration", "model", "workload", "compiled", "eager", "speed-up"]),
    "generation": ("Generation, greedy, batch 1: new tokens/s, median / best; speed-up = reference time / ours",
                   ["configuration", "model", "prompt", "ours", "reference", "speed-up", "ours without the cache"]),
    "floor": ("Generation against the weight-streaming floor (weights a step reads / matrix-vector bandwidth): new "
              "tokens/s, median / best; ours' time over the floor's",
              ["configuration", "model", "workload", "ours", "floor", "ours / floor (time)", "weights read per token"]),
    "static": ("Decoding, batch 1, with the static cache and generate()'s compiled step (inductor; CUDA "
               "graphs on a GPU) against ours eager with the default cache: new tokens/s, median / best; speed-up; "
               "static time over the weight-streaming floor; first static call (prompt, compilation, 2 steps)",
               ["configuration", "model", "workload", "static", "eager", "speed-up", "static / floor",
                "first call"]),
    "stream": ("Transformer-XL evaluation of a stream, batch 1: predicted tokens/s, median / best; memory's speed-up",
               ["configuration", "model", "attention", "with memory", "sliding window", "speed-up",
                "`transformers-xl evaluate` (cache)", "its speed-up"]),
    "deploy": ("Deployment, batch 1: tokens/s (segment) or new tokens/s (decoding), median / best, (speed-up over "
               "eager); eager time / ONNX Runtime time (target <= 1.25), with the memory as `mems` and in a cache",
               ["configuration", "model", "workload", *DEPLOY_SIDES, "eager / ORT", "eager, cache / ORT"]),
}  # fmt: skip


def deploy_cells(row) -> list[str]:
    """A deploy row's cells: every side's rate with its speed-up over eager, then eager's time over ORT's."""
    eager = row["sides"]["eager"]
    cells = []
    for name in DEPLOY_SIDES:
        side = row["sides"].get(name)
        if side is None:
            cells.append("-")
            continue
        text = cell(side, row)
        if side["status"] == "measured" and eager["status"] == "measured":
            text += f" ({eager['median'] / side['median']:.2f}x)"
        cells.append(text)
    ort = row["sides"].get("onnxruntime")
    for name in ("eager", "eager, cache"):
        side = row["sides"].get(name)
        measured = ort is not None and side is not None and ort["status"] == side["status"] == "measured"
        cells.append(f"{side['median'] / ort['median']:.2f}" if measured else "-")
    return cells


def markdown(run: Run) -> str:
    device = torch.device(run.args.device)
    gpu = f", {device_name(device)} ({device})" if device.type != "cpu" else ""
    lines = [
        f"{cpu_model()}{gpu}; torch {torch.__version__}, {run.args.threads} threads; attention "
        f"{run.args.attn_implementation} where a side's model supports it; matmul peak "
        + ", ".join(f"{name} {flops / 1e9:,.0f} GFLOP/s" for name, flops in run.peak_flops.items())
        + ("; workers with glibc keeping freed memory (--keep-freed-memory)" if run.args.keep_freed_memory else "")
        + ("; every side's evaluation and training under bf16 autocast" if run.args.autocast == "bf16" else ""),
    ]
    precision = "bf16 autocast" if run.args.autocast == "bf16" else "fp32"
    # (the published A100 column, where a row has a figure: ours' tokens/s over it, meaningful on a GPU only)
    a100 = any(row.get("nvidia_a100_tokens_per_second") for row in run.rows)
    for section, (title, header) in SECTIONS.items():
        rows = [row for row in run.rows if row["section"] == section]
        if not rows:
            continue
        if section == "throughput" and a100:
            header = [*header, "ours / NVIDIA 1 x A100 (published, mixed precision; a GPU's comparison)"]
        lines += ["", f"**{title.format(precision=precision)}**", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]  # fmt: skip
        for row in rows:
            if section == "deploy":
                lines.append("| " + " | ".join([row["config"], row["model"], row["workload"], *deploy_cells(row)]) + " |")
                continue
            sides = list(row["sides"].items())
            other_name, other = sides[1] if len(sides) > 1 else ("", {"status": "not measured"})
            other_cell = cell(other, row)
            ours_cell = cell(sides[0][1], row)
            if section in ("throughput", "memory", "generation"):
                other_cell += f" ({', '.join([other_name, *other_attention(run, row, other_name)])})"
                ours_cell += "".join(f" ({note})" for note in other_attention(run, row, sides[0][0]))
            r = row["ratio"]
            if section == "floor" and r:  # (ours' time over the floor's, where the speed-up would be the inverse)
                r = 1 / r
            cells = [row["config"], row["model"], row["workload"], ours_cell, other_cell,
                     f"{r:.2f}x" if r is not None else "-"]  # fmt: skip
            if section == "throughput":
                cells.append(percent_of_peak(run, row))
                if a100:
                    cells.append(nvidia_a100_cell(row))
            if section == "static":
                static = row["sides"]["static"]
                measured = static["status"] == "measured" and row["floor_seconds"]
                cells += [f"{static['median'] / row['floor_seconds']:.2f}x" if measured else "-",
                          f"{row['first_call_seconds']:.1f} s" + ("" if row["compiled"] else " (not compiled)")]
            if section == "generation":  # Transformer-XL: ours recomputing the sequence at every step
                cells.append(cell(sides[2][1], row) if len(sides) > 2 else "-")
            if section == "floor":
                cells.append(f"{row['weight_bytes'] / 2**20:,.1f} MiB at {row['gemv_bytes_per_second'] / 1e9:.1f} GB/s")
            if section == "stream":  # the evaluate command's loop, and its speed-up over the sliding window
                evaluate, window = row["sides"]["evaluate (cache)"], row["sides"]["sliding window"]
                measured = evaluate["status"] == window["status"] == "measured" and evaluate["median"]
                cells += [cell(evaluate, row), f"{window['median'] / evaluate['median']:.2f}x" if measured else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def other_attention(run: Run, row, side) -> list[str]:
    """["eager attention"] where `side` of `row` ran another attention implementation than --attn-implementation
    (its model supports no other), else []."""
    implementation = row.get("attn_implementation", {}).get(side, run.args.attn_implementation)
    return [] if implementation == run.args.attn_implementation else [f"{implementation} attention"]


def percent_of_peak(run: Run, row):
    """Ours' ideal FLOPs per second over the matmul peak of the dtype it computes in (bf16 under --autocast bf16)."""
    ours, dtype = row["sides"]["ours"], "bfloat16" if run.args.autocast == "bf16" else "float32"
    if "ideal_flops" not in row or ours["status"] != "measured" or dtype not in run.peak_flops:
        return "-"
    return f"{100 * row['ideal_flops'] / ours['median'] / run.peak_flops[dtype]:.0f}%"


def nvidia_a100_cell(row):
    """Ours' training tokens/s over NVIDIA's published one-A100 figure for the same recipe, where there is one."""
    published, ours = row.get("nvidia_a100_tokens_per_second"), row["sides"]["ours"]
    if not published or ours["status"] != "measured":
        return "-"
    return f"{rate(ours, row)[0] / published:.2f}x of {published:,}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--legacy-python", help=f"python of a transformers==4.37.2 venv (default: ${LEGACY_PYTHON_ENV})")
    parser.add_argument("--output", default="benchmark-results", help="folder for results.json and results.md")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CASES),
                        help=f"default: {' '.join(CASES)} (recipes: the papers' sizes, `recipe_cases`)")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS,
                        help="default: all (--quick: all but compile; --configs recipes or --autocast bf16: "
                             f"{' '.join(AUTOCAST_WORKLOADS)})")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch's threads, here and in every worker")
    parser.add_argument("--device", default="cpu", help="where every side runs: cpu (default) or cuda[:N]")
    parser.add_argument("--attn-implementation", default="sdpa", choices=ATTENTION_IMPLEMENTATIONS,
                        help="passed to from_pretrained where a side's model supports it, else eager (default sdpa)")
    parser.add_argument("--autocast", default="off", choices=["off", "bf16"],
                        help="bf16: every side's evaluation and training under torch.autocast(bfloat16) "
                             f"(the {', '.join(AUTOCAST_WORKLOADS[1:])} workloads only)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke test of the command")
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="time both sides with glibc keeping freed memory for reuse (KEEP_FREED_MEMORY_ENV)")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        folder, implementation, threads, device, attn_implementation, autocast = args.worker
        return worker_main(folder, implementation, int(threads), device, attn_implementation, autocast)
    try:
        args.device = str(parse_device(args.device))
    except ValueError as error:
        parser.error(str(error))
    if args.quick:
        args.rounds, args.warmup = min(args.rounds, 2), min(args.warmup, 1)
    if args.workloads:
        workloads = args.workloads
    elif args.configs == ["recipes"] or args.autocast != "off":
        workloads = AUTOCAST_WORKLOADS
    else:
        workloads = [w for w in WORKLOADS if not (args.quick and w == "compile")]
    if args.autocast != "off" and set(workloads) - set(AUTOCAST_WORKLOADS):
        parser.error(f"--autocast {args.autocast} measures the {', '.join(AUTOCAST_WORKLOADS)} workloads only, not "
                     + ", ".join(sorted(set(workloads) - set(AUTOCAST_WORKLOADS))))  # fmt: skip
    torch.set_num_threads(args.threads)
    if "deploy" in workloads:
        for side, reason in unmeasured_deploy_sides(args).items():
            print(f"deploy: {side} not measured: {reason}")
    with tempfile.TemporaryDirectory(prefix="bench_run_") as workdir:
        run = Run(args, Path(workdir))
        measure(run, workloads)
    write_results(run, Path(args.output))


def measure(run: Run, workloads: list[str]):
    """Every chosen workload, in the order the tables have them (the peak first and last)."""
    args = run.args
    if "peak" in workloads:
        measure_peak(run, "start")
    cases = chosen_cases(args.configs, args.quick)
    if torch.device(args.device).type == "cuda":
        cases = [replace(case, batch=case.cuda_batch or case.batch) for case in cases]
    shared = memory_in_timing_workers(args, workloads)
    for index, case in enumerate(cases):
        folder = run.workdir / f"{index}-{case.model}"
        write_case_folder(case, folder)
        if "throughput" in workloads:
            measure_throughput(run, case, folder, memory=shared)
        if "memory" in workloads and not shared:
            measure_memory(run, case, folder)
        first_of_model = case is next(c for c in cases if c.model == case.model)
        if "bf16" in workloads and first_of_model:
            measure_variants(run, case, folder, "bf16")
        if "compile" in workloads and first_of_model:
            measure_variants(run, case, folder, "compiled")
        if "stream" in workloads and case.model == "transfo-xl" and first_of_model:
            measure_stream(run, case, folder)
        shutil.rmtree(folder)  # (the recipes' weights: up to 1.3 GB a case)
        write_results(run, Path(args.output), finished=False)
    if "deploy" in workloads:
        for index, case in enumerate(deploy_cases(args.quick)):
            folder = run.workdir / f"deploy-{index}-{case.model}"
            write_case_folder(case, folder)
            measure_deploy(run, case, folder, pretrained_shape=args.quick)  # (--quick: see pretrained_decode_cases)
        for index, case in enumerate(pretrained_decode_cases(args.quick)):
            folder = run.workdir / f"decode-{index}-{case.model}"
            write_case_folder(case, folder)
            measure_deploy(run, case, folder, segment=False, pretrained_shape=True)
            shutil.rmtree(folder)  # (up to 1.1 GB of weights)
    if "generation" in workloads:
        measure_generation(run)
    if "static" in workloads:
        measure_static_decoding(run)
    if "peak" in workloads:
        measure_peak(run, "end")


def write_results(run: Run, output: Path, finished: bool = True):
    """DIR/results.json and DIR/results.md, each written whole under a temporary name and then renamed: after every
    case (`finished` false: what a run stopped by a time limit, as on a lent GPU, leaves), and at the end."""
    args = run.args
    output.mkdir(parents=True, exist_ok=True)
    results = {
        "cpu": cpu_model(),
        "cpu_count": len(os.sched_getaffinity(0)),
        "device": args.device,
        "device_name": device_name(args.device),
        "attn_implementation": args.attn_implementation,
        "torch": torch.__version__,
        "gemv_bytes_per_second": run.gemv_bandwidth,
        "threads": args.threads,
        "quick": args.quick,
        "configs": args.configs,
        "autocast": args.autocast,
        "legacy_python": legacy_python(args.legacy_python),
        "matmul_peak_flops": run.peak_flops,
        "matmul_peak_measurements": run.peak_measurements,
        "gemv_measurements": run.gemv_measurements,
        "worker_env": KEEP_FREED_MEMORY_ENV if args.keep_freed_memory else {},
        "rows": run.rows,
        "finished": finished,
    }
    table = markdown(run) if finished else f"(the run had not finished: the cases measured so far)\n\n{markdown(run)}"
    for name, text in (("results.json", json.dumps(results, indent=1)), ("results.md", table)):
        partial = output / f".{name}.partial"
        partial.write_text(text)
        partial.replace(output / name)
    if finished:
        print(f"\nwrote {output / 'results.json'} and {output / 'results.md'}\n")
        print(table)


if __name__ == "__main__":
    sys.exit(main())
