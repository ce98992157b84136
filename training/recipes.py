"""The paper's training recipes: the original `run_*_large.sh` scripts (which trained the released checkpoints) and
`train.py`'s defaults, with the model of `hub_configs/`; and `tiny`, for trying the command in a minute.

Every recipe trains with Adam (no weight decay), a linear warm-up then cosine annealing to 0 over `max_steps`,
gradient clipping 0.25, init N(0, 0.02) (projections N(0, 0.01)), tied embeddings, `tgt_len = mem_len` in
training (no `same_length`, no clamping), and evaluates during training as `train.py` does (segments of
`eval_tgt_len`, memory `mem_len + tgt_len - eval_tgt_len`, batch 10) and at the end with `eval_settings`, the
`eval` branch of its script (see docs/evaluation.md). None of the scripts uses `--varlen`.
"""

import json
import math
from dataclasses import dataclass, field, replace

from ..hub_configs import config_path


@dataclass(frozen=True)
class Recipe:
    name: str
    model: dict  # TransfoXLConfig arguments (vocab_size and cutoffs are set from the corpus)
    line_end: str  # see corpus.LINE_ENDS
    special: tuple[str, ...]  # symbols put first in the vocabulary
    unk_token: str | None  # the unknown symbol, appended to a counted vocabulary that lacks it (None: characters)
    vocab_from_valid: bool  # enwik8 / text8 count their vocabulary over every split, the word corpora over train
    batch_size: int
    tgt_len: int
    eval_tgt_len: int
    learning_rate: float
    warmup_steps: int
    max_steps: int
    eval_settings: dict = field(default_factory=dict)  # tgt_len, mem_len, clamp_len, same_length, batch_size
    reference_vocab_size: int = 0  # the vocabulary the cutoffs were chosen for

    @property
    def character_level(self) -> bool:
        return self.unk_token is None

    @property
    def eval_mem_len(self) -> int:
        """train.py's evaluation keeps the attention length: mem_len + tgt_len - eval_tgt_len."""
        return 2 * self.tgt_len - self.eval_tgt_len


def _hub_model(name: str) -> dict:
    with open(config_path(name), encoding="utf-8") as file:
        config = json.load(file)
    keys = ("n_layer", "d_model", "d_embed", "n_head", "d_head", "d_inner", "dropout", "dropatt", "div_val",
            "adaptive", "cutoffs", "tie_projs", "untie_r", "pre_lnorm", "attn_type", "layer_norm_epsilon")  # fmt: skip
    return {key: config[key] for key in keys if key in config} | {"vocab_size": config["vocab_size"]}


def _eval_settings(name: str, batch_size: int = 10) -> dict:
    with open(config_path(name), encoding="utf-8") as file:
        config = json.load(file)
    return {key: config[key] for key in ("tgt_len", "mem_len", "clamp_len", "same_length")} | {"batch_size": batch_size}


def _released(name, **settings) -> Recipe:
    model = _hub_model(name)
    return Recipe(name=name, model=model, reference_vocab_size=model.pop("vocab_size"),
                  eval_settings=_eval_settings(name, settings.pop("eval_batch_size", 10)), **settings)  # fmt: skip


WORDS = dict(line_end="eos", special=("<eos>",), unk_token="<unk>", vocab_from_valid=False)
CHARACTERS = dict(line_end="none", special=(), unk_token=None, vocab_from_valid=True)
RECIPES = {
    # run_wt103_large.sh
    "wt103": _released("wt103", **WORDS, batch_size=128, tgt_len=384, eval_tgt_len=128, learning_rate=2.5e-4,
                       warmup_steps=16000, max_steps=4_000_000),
    # run_enwik8_large.sh, run_text8_large.sh
    "enwik8": _released("enwik8", **CHARACTERS, batch_size=64, tgt_len=768, eval_tgt_len=128, learning_rate=2.5e-4,
                        warmup_steps=4000, max_steps=400_000),
    "text8": _released("text8", **CHARACTERS, batch_size=64, tgt_len=768, eval_tgt_len=128, learning_rate=2.5e-4,
                       warmup_steps=0, max_steps=400_000),
    # run_lm1b_large.sh (the original reads its vocabulary from 1b_word_vocab.txt: pass it with --vocab)
    "lm1b": _released("lm1b", line_end="double-eos", special=("<S>",), unk_token="<UNK>", vocab_from_valid=False,
                      batch_size=512, tgt_len=32, eval_tgt_len=32, learning_rate=2.5e-4, warmup_steps=30000,
                      max_steps=1_200_000, eval_batch_size=8),
    # Not the paper's: a word-level model small enough to train in a minute on 2 CPU cores.
    "tiny": Recipe(
        name="tiny", **WORDS, batch_size=8, tgt_len=32, eval_tgt_len=32, learning_rate=1e-3, warmup_steps=20,
        max_steps=200,
        model=dict(n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=32, d_inner=256, dropout=0.1, dropatt=0.0,
                   div_val=1, adaptive=False, cutoffs=[], tie_projs=[False]),
        eval_settings=dict(tgt_len=32, mem_len=64, clamp_len=-1, same_length=True, batch_size=10),
    ),
}  # fmt: skip


def scaled(recipe: Recipe, scale: float) -> Recipe:
    """The recipe shrunk for a small machine: depth, heads (so width: d_model = heads x d_head, d_embed in
    proportion), feed-forward width and batch multiplied by `scale` (rounded, at least 1). Sequence lengths,
    steps, learning rate and schedule are kept."""
    if scale == 1:
        return recipe
    model = dict(recipe.model)
    n_head = max(1, round(model["n_head"] * scale))
    width = n_head * model["d_head"]
    model.update(
        n_layer=max(1, round(model["n_layer"] * scale)),
        n_head=n_head,
        d_model=width,
        d_embed=max(1, round(model["d_embed"] * width / model["d_model"])),
        d_inner=max(1, round(model["d_inner"] * scale)),
    )
    return replace(recipe, model=model, batch_size=max(1, round(recipe.batch_size * scale)))


def learning_rate_factor(recipe_warmup: int, max_steps: int):
    """train.py's schedule as a LambdaLR factor of the step: linear warm-up `step / warmup`, then cosine annealing
    over the whole run, `(1 + cos(pi * step / max_steps)) / 2` (counted from step 0, as CosineAnnealingLR
    stepped with the global step)."""

    def factor(step: int) -> float:
        if step < recipe_warmup:
            return step / recipe_warmup
        return 0.5 * (1.0 + math.cos(math.pi * min(step, max_steps) / max_steps))

    return factor
