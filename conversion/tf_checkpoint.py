"""Original TF checkpoints -> our models: kimiyoung/transformer-xl (`transformer/...`) and zihangdai/xlnet
(`model/transformer/...`, with the fine-tuning heads of run_classifier.py / run_squad.py / run_race.py).

Each model has one table from TF variable names (with their expected shapes) to our parameter names and the
transform each needs (transpose a dense kernel, split a per-layer stack, copy a shared tensor to every layer, place
a cluster's bias in its rows). Then strict checks, all reported at once: every TF variable is used or is training
state (optimizer slots, global_step, beta powers), every table entry exists with its shape, and the result fills
every parameter and buffer of the model class exactly.

The configs keep the original numerics: layer norm epsilon 1e-12, the tanh GELU (`gelu_new`), and for
Transformer-XL the TF `same_length` mask (`same_length_span=1`) and the zero initial memory train_gpu.py feeds
(`zero_initial_mems`), so the converted model gives the original graph's log-probabilities and memories.
"""

import importlib.util
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from transformers.utils import logging

from ..modeling.configuration_transfo_xl import TransfoXLConfig
from ..modeling.configuration_xlnet import XLNetConfig
from ..modeling.modeling_transfo_xl import TransfoXLLMHeadModel
from ..modeling.modeling_xlnet import (
    XLNetForMultipleChoice,
    XLNetForQuestionAnswering,
    XLNetForSequenceClassification,
    XLNetLMHeadModel,
)
from ..modeling.relative_attention import sinusoid_inverse_frequencies
from .converted import ConvertedCheckpoint, checkpoint_state_dict, does_not_fit
from .source_files import read_json
from .tf_bundle import TFCheckpoint, checkpoint_prefix


# What training leaves in a checkpoint besides the weights: optimizer slots (tf.train.AdamOptimizer's `Adam`,
# `Adam_1` and beta powers; XLNet's AdamWeightDecayOptimizer's `adam_m`, `adam_v`; other TF1 optimizers) and the step.
TRAINING_STATE = re.compile(
    r"(^|/)(global_step|beta[12]_power(_\d+)?)$|/(Adam(_\d+)?|adam_[mv]|Momentum|RMSProp(_\d+)?|Adagrad)$"
)
VOCABULARY_FILES = ("spiece.model", "vocab.txt", "vocab.pkl")


@dataclass(frozen=True)
class Variable:
    """One TF variable and where it goes: `targets` get it as is ("copy"; several targets are tied weights and share
    the one tensor), its transpose ("transpose": dense kernels [in, out] -> weights [out, in], projections; tied
    targets share it too), a copy each ("every_layer": a bias the original shares across layers), its slices along
    dim 0 ("per_layer": one per target), or rows `row_offset...` of the single target ("rows")."""

    name: str
    shape: tuple[int, ...]
    targets: tuple[str, ...]
    transform: str = "copy"
    row_offset: int = 0


def _dense(name, shape, ours, bias=True):
    """A TF dense layer `name/{kernel,bias}` [in, out] -> our nn.Linear `ours.{weight,bias}`."""
    table = [Variable(f"{name}/kernel", shape, (f"{ours}.weight",), "transpose")]
    if bias:
        table.append(Variable(f"{name}/bias", shape[-1:], (f"{ours}.bias",)))
    return table


def _read_json(path_or_dict, what):
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    path = Path(path_or_dict)
    if not path.is_file():
        raise ValueError(f"{what}: {path} does not exist")
    try:
        return read_json(path)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def _model_kind(names) -> str:
    if any(name.startswith("model/transformer/") for name in names):
        return "xlnet"
    if any(name.startswith("transformer/") for name in names):
        return "transfo-xl"
    shown = ", ".join(sorted(n for n in names if not TRAINING_STATE.search(n))[:5]) or "only training state"
    raise ValueError(
        "TF checkpoint: neither a Transformer-XL (variables under `transformer/`) nor an XLNet checkpoint (under "
        f"`model/transformer/`); it holds {shown}"
    )


def _assemble(checkpoint: TFCheckpoint, table: list[Variable], model_class, config, computed, ignored=()):
    """The state dict of `model_class(config)` from `table` plus `computed` tensors, after the strict checks."""
    entries = checkpoint.entries
    problems = []
    for variable in table:
        entry = entries.get(variable.name)
        if entry is None:
            problems.append(f"missing variable {variable.name} (expected shape {list(variable.shape)})")
        elif entry.shape != variable.shape:
            problems.append(
                f"variable {variable.name} has shape {list(entry.shape)}; the config expects {list(variable.shape)}"
            )
    used = {variable.name for variable in table}
    for name in sorted(entries):
        if name not in used and not TRAINING_STATE.search(name) and not any(name.startswith(p) for p in ignored):
            problems.append(f"unknown variable {name} {list(entries[name].shape)} maps to no parameter")
    if problems:
        raise does_not_fit(f"TF checkpoint {checkpoint.prefix}", model_class, problems)

    with torch.device("meta"):
        expected = {key: tuple(value.shape) for key, value in checkpoint_state_dict(model_class(config)).items()}
    state = dict(computed)
    for variable in logging.tqdm(table, desc="Reading TF variables", unit="variable"):
        tensor = checkpoint.read(variable.name)
        tensor = tensor.float() if tensor.is_floating_point() else tensor
        if variable.transform == "transpose":
            tensor = tensor.t().contiguous()
        if variable.transform == "per_layer":
            pieces = [piece.clone() for piece in tensor.unbind(0)]
        elif variable.transform == "every_layer":
            pieces = [tensor.clone() for _ in variable.targets]
        else:
            pieces = [tensor] * len(variable.targets)
        for target, piece in zip(variable.targets, pieces):
            if variable.transform == "rows":
                buffer = state.setdefault(target, torch.empty(expected[target]))
                buffer[variable.row_offset : variable.row_offset + piece.shape[0]] = piece
            else:
                state[target] = piece
    wrong = {k: tuple(v.shape) for k, v in state.items() if expected.get(k) != tuple(v.shape)}
    if wrong or state.keys() != expected.keys():
        raise AssertionError(  # a bug in the tables, not bad input
            f"TF conversion table out of step with {model_class.__name__}: "
            f"missing {sorted(expected.keys() - state.keys())}, extra {sorted(state.keys() - expected.keys())}, "
            f"mis-shaped {wrong}"
        )
    return state


def _converted(checkpoint, model_class, config, state, described, compare) -> ConvertedCheckpoint:
    """The result, with `compare(model)` (runs the original graph) only where TensorFlow is installed and with the
    vocabulary files found beside the checkpoint (the released XLNet zips put spiece.model there)."""
    folder = Path(checkpoint.prefix).parent
    return ConvertedCheckpoint(
        model_class=model_class,
        config=config,
        state_dict=state,
        source=f"TF checkpoint {Path(checkpoint.prefix).name} ({described})",
        compare_with_source=compare if importlib.util.find_spec("tensorflow") is not None else None,
        tokenizer_files={name: str(folder / name) for name in VOCABULARY_FILES if (folder / name).is_file()},
    )


# ----- Transformer-XL --------------------------------------------------------------------------------------------

# The model flags of kimiyoung tf/train_gpu.py with their defaults; the other flags of train_gpu.py / train.py
# (data, optimisation, TPU) are accepted and ignored.
TXL_FLAGS = dict(
    n_layer=6, d_model=500, d_embed=500, n_head=10, d_head=50, d_inner=1000, dropout=0.1, dropatt=0.1,
    untie_r=False, tie_weight=True, div_val=1, proj_share_all_but_first=False, proj_same_dim=True, init="normal",
    init_std=0.02, proj_init_std=0.01, init_range=0.1, tgt_len=70, mem_len=70, same_length=False, clamp_len=-1,
)
TXL_OTHER_FLAGS = {
    "num_hosts", "num_core_per_host", "data_dir", "record_info_dir", "corpus_info_path", "model_dir", "do_train",
    "do_eval", "eval_ckpt_path", "warm_start_path", "learning_rate", "clip", "min_lr_ratio", "warmup_steps",
    "train_batch_size", "eval_batch_size", "train_steps", "iterations", "save_steps", "do_test", "max_eval_batch",
    "do_eval_only", "start_eval_steps", "eval_split", "master", "tpu", "gcp_project", "tpu_zone", "use_tpu",
    "track_mean",
}


def _txl_spec(config, corpus_info):
    """(TransfoXLConfig, spec): spec holds the original hyper-parameters (tf_reference.transformer_xl_lm's)."""
    data = _read_json(config, "--config")
    if "model_type" in data:
        if data["model_type"] != "transfo-xl":
            raise ValueError(
                f"--config is a {data['model_type']!r} config, but the checkpoint is a Transformer-XL checkpoint"
            )
        proj_same_dim = data.pop("proj_same_dim", True)
        ours = TransfoXLConfig.from_dict(data)
        if ours.attn_type != 0 or ours.pre_lnorm or not ours.tie_weight:
            raise ValueError(
                "--config: the original TF Transformer-XL has attn_type 0, post-layer-norm and softmax weights tied "
                f"to the embeddings; the config says attn_type={ours.attn_type}, pre_lnorm={ours.pre_lnorm}, "
                f"tie_weight={ours.tie_weight}"
            )
        spec = dict(
            n_token=ours.vocab_size, cutoffs=list(ours.cutoffs), tie_projs=list(ours.tie_projs),
            proj_same_dim=proj_same_dim,
            **{k: getattr(ours, k) for k in ("n_layer", "d_model", "d_embed", "n_head", "d_head", "d_inner",
                                              "div_val", "untie_r", "same_length", "clamp_len", "mem_len")},
        )
        if corpus_info is not None:
            info_size, info_cutoffs = _corpus_info(corpus_info)
            if (info_size, info_cutoffs) != (spec["n_token"], spec["cutoffs"]):
                raise ValueError(
                    f"--corpus-info says vocab_size {info_size}, cutoffs {info_cutoffs}; --config says "
                    f"{spec['n_token']}, {spec['cutoffs']}"
                )
    else:
        unknown = sorted(set(data) - set(TXL_FLAGS) - TXL_OTHER_FLAGS)
        if unknown:
            raise ValueError(
                f"--config: unknown flags {unknown}; expected a transformers config.json (with model_type) or the "
                f"flags of kimiyoung tf/train_gpu.py ({', '.join(TXL_FLAGS)}, ...)"
            )
        if corpus_info is None:
            raise ValueError(
                "--corpus-info is required with original training flags: the corpus-info.json written by "
                "data_utils.py gives the vocabulary size and the cutoffs"
            )
        flags = {**TXL_FLAGS, **{k: v for k, v in data.items() if k in TXL_FLAGS}}
        n_token, cutoffs = _corpus_info(corpus_info)
        spec = dict(
            n_token=n_token, cutoffs=cutoffs,
            tie_projs=[False] + [bool(flags["proj_share_all_but_first"])] * len(cutoffs),
            **{k: flags[k] for k in ("n_layer", "d_model", "d_embed", "n_head", "d_head", "d_inner", "div_val",
                                     "untie_r", "same_length", "clamp_len", "mem_len", "proj_same_dim")},
        )
        ours = TransfoXLConfig(
            vocab_size=n_token, cutoffs=cutoffs, tie_projs=spec["tie_projs"],
            proj_share_all_but_first=flags["proj_share_all_but_first"], tie_weight=True, pre_lnorm=False, attn_type=0,
            **{k: flags[k] for k in ("n_layer", "d_model", "d_embed", "n_head", "d_head", "d_inner", "div_val",
                                     "untie_r", "same_length", "clamp_len", "mem_len", "tgt_len", "dropout",
                                     "dropatt", "init", "init_range", "init_std", "proj_init_std")},
        )
    if not spec["cutoffs"] and spec["div_val"] != 1:
        raise ValueError(
            f"--config: div_val={spec['div_val']} without cutoffs; the original code builds no model for that "
            "(its single softmax needs div_val 1)"
        )
    if not spec["cutoffs"]:
        spec["tie_projs"] = [True]  # the single softmax always reuses the embedding projection
    # The original numerics (see the module docstring).
    ours.update(dict(layer_norm_epsilon=1e-12, same_length_span=1, zero_initial_mems=True, tie_projs=spec["tie_projs"]))
    ours.architectures = ["TransfoXLLMHeadModel"]
    return ours, spec


def _corpus_info(corpus_info):
    data = _read_json(corpus_info, "--corpus-info")
    size, cutoffs = data.get("vocab_size"), data.get("cutoffs")
    if not isinstance(size, int) or not isinstance(cutoffs, list):
        raise ValueError(
            '--corpus-info: expected {"vocab_size": int, "cutoffs": [0, ..., vocab_size]} as data_utils.py writes it'
        )
    if cutoffs and (cutoffs[0] != 0 or cutoffs[-1] != size):
        raise ValueError(f"--corpus-info: cutoffs {cutoffs} must start at 0 and end at vocab_size {size}")
    return size, list(cutoffs[1:-1])


def _txl_table(spec):
    """TF names of kimiyoung tf/model.py `transformer` -> our TransfoXLLMHeadModel names, and computed tensors."""
    t = "transformer/"
    table, computed = _txl_adaptive_table(spec)
    computed["transformer.pos_emb.inv_freq"] = sinusoid_inverse_frequencies(spec["d_model"])
    n_layer, d_model, d_inner = spec["n_layer"], spec["d_model"], spec["d_inner"]
    heads = (spec["n_head"], spec["d_head"])
    for bias in ("r_w_bias", "r_r_bias"):
        if spec["untie_r"]:
            targets = tuple(f"transformer.layers.{i}.dec_attn.{bias}" for i in range(n_layer))
            table.append(Variable(t + bias, (n_layer, *heads), targets, "per_layer"))
        else:
            table.append(Variable(t + bias, heads, (f"transformer.{bias}",)))
    inner = heads[0] * heads[1]
    for i in range(n_layer):
        scope, ours = f"{t}layer_{i}/", f"transformer.layers.{i}."
        table += _dense(scope + "rel_attn/qkv", (d_model, 3 * inner), ours + "dec_attn.qkv_net", bias=False)
        table += _dense(scope + "rel_attn/r", (d_model, inner), ours + "dec_attn.r_net", bias=False)
        table += _dense(scope + "rel_attn/o", (inner, d_model), ours + "dec_attn.o_net", bias=False)
        table += _dense(scope + "ff/layer_1", (d_model, d_inner), ours + "pos_ff.CoreNet.0")
        table += _dense(scope + "ff/layer_2", (d_inner, d_model), ours + "pos_ff.CoreNet.3")
        for tf_scope, norm in (("rel_attn", "dec_attn.layer_norm"), ("ff", "pos_ff.layer_norm")):
            table.append(Variable(f"{scope}{tf_scope}/LayerNorm/gamma", (d_model,), (f"{ours}{norm}.weight",)))
            table.append(Variable(f"{scope}{tf_scope}/LayerNorm/beta", (d_model,), (f"{ours}{norm}.bias",)))
    return table, computed


def _txl_adaptive_table(spec):
    """The adaptive embedding and softmax (mask_adaptive_embedding_lookup / mask_adaptive_logsoftmax).

    The softmax weights are always the embedding tables. A cluster of width `dim` has a projection unless
    `dim == d_model` and (div_val == 1 or not proj_same_dim); where ours has a projection and TF none, it is the
    identity. Tied softmax projections (`tie_projs[c]`) are the embedding projection of cluster c (with div_val 1:
    the single embedding projection)."""
    t, emb, crit = "transformer/", "transformer.word_emb.", "crit."
    d_model, d_embed, div_val, tie_projs = spec["d_model"], spec["d_embed"], spec["div_val"], spec["tie_projs"]
    ends = [0, *spec["cutoffs"], spec["n_token"]]
    clusters = range(len(ends) - 1)
    table, computed = [], {}

    def projection(name, dim, targets):
        if dim != d_model or (div_val > 1 and spec["proj_same_dim"]):
            table.append(Variable(name, (dim, d_model), tuple(targets), "transpose"))
        elif div_val > 1:  # with div_val 1 ours has no projection either
            identity = torch.eye(d_model)  # one tensor: the targets are tied
            computed.update({target: identity for target in targets})

    if div_val == 1:
        table.append(Variable(t + "adaptive_embed/lookup_table", (spec["n_token"], d_embed),
                              (f"{emb}emb_layers.0.weight", f"{crit}out_layers.0.weight")))
        tied = [f"{crit}out_projs.{c}" for c in clusters if tie_projs[c]]
        projection(t + "adaptive_embed/proj_W", d_embed, [f"{emb}emb_projs.0", *tied])
    else:
        for i in clusters:
            scope, dim = f"{t}adaptive_embed/cutoff_{i}/", d_embed // div_val**i
            table.append(Variable(scope + "lookup_table", (ends[i + 1] - ends[i], dim),
                                  (f"{emb}emb_layers.{i}.weight", f"{crit}out_layers.{i}.weight")))
            projection(scope + "proj_W", dim, [f"{emb}emb_projs.{i}"] + [f"{crit}out_projs.{i}"] * tie_projs[i])

    if not spec["cutoffs"]:
        table.append(Variable(t + "adaptive_softmax/bias", (spec["n_token"],), (f"{crit}out_layers.0.bias",)))
        return table, computed
    for i in clusters:
        scope, size = f"{t}adaptive_softmax/cutoff_{i}/", ends[i + 1] - ends[i]
        if div_val == 1:  # one output layer: each cluster's bias is a slice of it
            table.append(Variable(scope + "b", (size,), (f"{crit}out_layers.0.bias",), "rows", ends[i]))
        else:
            table.append(Variable(scope + "b", (size,), (f"{crit}out_layers.{i}.bias",)))
        if not tie_projs[i]:
            projection(scope + "proj", d_embed // div_val**i, [f"{crit}out_projs.{i}"])
    head = t + "adaptive_softmax/cutoff_0/"
    table.append(Variable(head + "cluster_W", (len(ends) - 2, d_embed), (f"{crit}cluster_weight",)))
    table.append(Variable(head + "cluster_b", (len(ends) - 2,), (f"{crit}cluster_bias",)))
    return table, computed


def _read_transfo_xl(checkpoint, config, corpus_info):
    if config is None:
        raise ValueError(
            "--config is required for a Transformer-XL TF checkpoint (train_gpu.py flags or a config.json)"
        )
    ours, spec = _txl_spec(config, corpus_info)
    table, computed = _txl_table(spec)
    state = _assemble(checkpoint, table, TransfoXLLMHeadModel, ours, computed)

    compare = partial(_compare_transfo_xl, spec=spec, prefix=checkpoint.prefix)
    described = "Transformer-XL, kimiyoung/transformer-xl"
    return _converted(checkpoint, TransfoXLLMHeadModel, ours, state, described, compare)


def _sample_ids(vocab_size, shape, seed=0):
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed))


def _compare_transfo_xl(model, spec, prefix) -> float:
    """Two segments through the original graph (tf_reference) and through `model`: max |difference| of the
    log-probabilities and memories."""
    from . import tf_reference

    segments = [_sample_ids(spec["n_token"], (2, 6), seed) for seed in (0, 1)]
    expected = tf_reference.run_transformer_xl(spec, [s.t().numpy() for s in segments], checkpoint=prefix)
    difference, mems = 0.0, None
    with torch.no_grad():
        for segment, reference in zip(segments, expected):
            output = model(segment, mems=mems)
            mems = output.mems
            difference = max(
                difference,
                (output.logits.float() - torch.from_numpy(reference["log_probs"]).transpose(0, 1)).abs().max().item(),
                max((ours.float() - torch.from_numpy(theirs)).abs().max().item()
                    for ours, theirs in zip(mems, reference["mems"])),
            )
    return difference


# ----- XLNet ------------------------------------------------------------------------------------------------------

XLNET_KEYS = ("n_token", "n_layer", "d_model", "n_head", "d_head", "d_inner", "ff_activation", "untie_r")
# Run-time settings of the original (RunConfig, run_*.py flags) a config may add, with our config's field names.
XLNET_RUNTIME = {
    "mem_len": "mem_len", "reuse_len": "reuse_len", "bi_data": "bi_data", "clamp_len": "clamp_len",
    "same_length": "same_length", "dropout": "dropout", "summary_type": "summary_type", "init_std": "initializer_range",
    "start_n_top": "start_n_top", "end_n_top": "end_n_top",
}
XLNET_IGNORED = {"dropatt", "init", "init_range", "use_bfloat16", "use_tpu", "use_summ_proj"}
ACTIVATIONS = {"gelu": "gelu_new", "gelu_new": "gelu_new", "relu": "relu"}  # the original gelu is the tanh one


def _xlnet_config(config):
    """(XLNetConfig, untie_r) from xlnet_config.json (plus run-time keys) or a transformers XLNet config."""
    data = _read_json(config, "--config")
    if "model_type" in data:
        if data["model_type"] != "xlnet":
            raise ValueError(f"--config is a {data['model_type']!r} config, but the checkpoint is an XLNet checkpoint")
        untie_r = data.pop("untie_r", True)
        activation = data.get("ff_activation", "gelu")
    else:
        missing = [key for key in XLNET_KEYS if key not in data]
        unknown = sorted(set(data) - set(XLNET_KEYS) - set(XLNET_RUNTIME) - XLNET_IGNORED)
        if missing or unknown:
            raise ValueError(
                f"--config: expected the keys of xlnet_config.json ({', '.join(XLNET_KEYS)}; missing {missing}) and "
                f"optionally run-time settings ({', '.join(XLNET_RUNTIME)}); unknown keys {unknown}"
            )
        untie_r, activation = data["untie_r"], data["ff_activation"]
        data = {
            "vocab_size": data["n_token"],
            **{key: data[key] for key in ("n_layer", "d_model", "n_head", "d_head", "d_inner")},
            **{ours: data[key] for key, ours in XLNET_RUNTIME.items() if key in data},
        }
    if activation not in ACTIVATIONS:
        raise ValueError(f"--config: ff_activation {activation!r}; the original XLNet has 'gelu' or 'relu'")
    data["ff_activation"] = ACTIVATIONS[activation]
    data.pop("model_type", None)
    return XLNetConfig(**data), bool(untie_r)


def _xlnet_heads(names) -> dict[str, str]:
    """The fine-tuning heads a checkpoint holds: {task: kind} (kind: classification, regression, squad, race)."""
    heads = {}
    for name in names:
        match = re.fullmatch(r"model/(classification|regression)_(.+)/logit/kernel", name)
        if match:
            heads[match[2]] = match[1]
    if "start_logits/dense/kernel" in names:
        heads["squad"] = "squad"
    if "logits/dense/kernel" in names:
        heads["race"] = "race"
    return heads


def _choose_head(names, task):
    """(task, kind) of the head to convert: `task` if given ("lm" for the language model), else the one fine-tuning
    head the checkpoint holds, else the language model."""
    heads = _xlnet_heads(names)
    found = ", ".join(f"{name!r} ({kind})" for name, kind in heads.items()) or "none"
    if task == "lm" or (task is None and not heads):
        return "lm", "lm"
    if task is None and len(heads) > 1:
        raise ValueError(f"the checkpoint holds several heads: {found}; choose one with --task")
    if task is None:
        return next(iter(heads.items()))
    if task not in heads:
        raise ValueError(f"--task {task!r}: the checkpoint holds no such head; heads found: {found} (or 'lm')")
    return task, heads[task]


def _unused_head_scopes(names, task, kind):
    """Scopes of the heads not converted: their variables are left out on purpose (all others must map)."""
    scopes = {f"model/{other_kind}_{other}/" for other, other_kind in _xlnet_heads(names).items()
              if other_kind in ("classification", "regression") and other != task}
    if kind != "squad":
        scopes |= {"start_logits/", "end_logits/", "answer_class/"}
    if kind != "race":
        scopes.add("logits/")
    if kind != "lm":
        scopes.add("model/lm_loss/")
    if kind in ("lm", "squad"):
        scopes.add("model/sequnece_summary/")
    return tuple(scopes)


def _xlnet_table(config, untie_r, kind, task, names):
    """TF names of zihangdai modeling.py / function_builder.py -> our head model's names, and computed tensors."""
    t, d, n_layer = "model/transformer/", config.d_model, config.n_layer
    heads = (config.n_head, config.d_head)
    table = [Variable(t + "word_embedding/lookup_table", (config.vocab_size, d),
                      ("transformer.word_embedding.weight",) + (("lm_loss.weight",) if kind == "lm" else ()))]
    computed = {}
    # The query stream's mask embedding exists only in pretraining graphs; fine-tuned heads never read it.
    if kind == "lm" or t + "mask_emb/mask_emb" in names:
        table.append(Variable(t + "mask_emb/mask_emb", (1, 1, d), ("transformer.mask_emb",)))
    else:
        computed["transformer.mask_emb"] = torch.zeros(1, 1, d)
    for bias in ("r_w_bias", "r_r_bias", "r_s_bias"):
        targets = tuple(f"transformer.layer.{i}.rel_attn.{bias}" for i in range(n_layer))
        if untie_r:
            table.append(Variable(t + bias, (n_layer, *heads), targets, "per_layer"))
        else:  # one bias shared by every layer: a copy in each
            table.append(Variable(t + bias, heads, targets, "every_layer"))
    table.append(Variable(t + "seg_embed", (n_layer, 2, *heads),
                          tuple(f"transformer.layer.{i}.rel_attn.seg_embed" for i in range(n_layer)), "per_layer"))
    for i in range(n_layer):
        scope, ours = f"{t}layer_{i}/", f"transformer.layer.{i}."
        table += [Variable(f"{scope}rel_attn/{p}/kernel", (d, *heads), (f"{ours}rel_attn.{p}",)) for p in "qkvor"]
        table += _dense(scope + "ff/layer_1", (d, config.d_inner), ours + "ff.layer_1")
        table += _dense(scope + "ff/layer_2", (config.d_inner, d), ours + "ff.layer_2")
        for tf_scope, norm in (("rel_attn", "rel_attn.layer_norm"), ("ff", "ff.layer_norm")):
            table.append(Variable(f"{scope}{tf_scope}/LayerNorm/gamma", (d,), (f"{ours}{norm}.weight",)))
            table.append(Variable(f"{scope}{tf_scope}/LayerNorm/beta", (d,), (f"{ours}{norm}.bias",)))

    if kind == "lm":
        table.append(Variable("model/lm_loss/bias", (config.vocab_size,), ("lm_loss.bias",)))
    elif kind == "squad":
        table += _dense("start_logits/dense", (d, 1), "start_logits.dense")
        table += _dense("end_logits/dense_0", (2 * d, d), "end_logits.dense_0")
        table.append(Variable("end_logits/LayerNorm/gamma", (d,), ("end_logits.LayerNorm.weight",)))
        table.append(Variable("end_logits/LayerNorm/beta", (d,), ("end_logits.LayerNorm.bias",)))
        table += _dense("end_logits/dense_1", (d, 1), "end_logits.dense_1")
        table += _dense("answer_class/dense_0", (2 * d, d), "answer_class.dense_0")
        table += _dense("answer_class/dense_1", (d, 1), "answer_class.dense_1", bias=False)
    else:
        if config.summary_use_proj:
            table += _dense("model/sequnece_summary/summary", (d, d), "sequence_summary.summary")
        if kind == "race":
            table += _dense("logits/dense", (d, 1), "logits_proj")
        else:
            table += _dense(f"model/{kind}_{task}/logit", (d, config.num_labels), "logits_proj")
    return table, computed


XLNET_CLASSES = {
    "lm": XLNetLMHeadModel,
    "classification": XLNetForSequenceClassification,
    "regression": XLNetForSequenceClassification,
    "squad": XLNetForQuestionAnswering,
    "race": XLNetForMultipleChoice,
}


def _read_xlnet(checkpoint, config, task):
    if config is None:
        raise ValueError("--config is required for an XLNet TF checkpoint (xlnet_config.json or a config.json)")
    ours, untie_r = _xlnet_config(config)
    names = checkpoint.entries
    task, kind = _choose_head(names, task)
    if "model/sequnece_summary/summary_bias" in names:
        raise ValueError(
            "the checkpoint's sequence summary is summary_type 'attn' (model/sequnece_summary/summary_bias), which "
            "our XLNetSequenceSummary does not implement"
        )
    if kind in ("classification", "regression", "race"):
        ours.summary_use_proj = "model/sequnece_summary/summary/kernel" in names
    if kind == "classification":
        ours.num_labels = names[f"model/classification_{task}/logit/kernel"].shape[-1]
    elif kind == "regression":
        ours.num_labels, ours.problem_type = 1, "regression"
    if kind in ("classification", "regression"):
        ours.finetuning_task = task
    model_class = XLNET_CLASSES[kind]
    ours.architectures = [model_class.__name__]
    table, computed = _xlnet_table(ours, untie_r, kind, task, names)
    ignored = _unused_head_scopes(names, task, kind)
    state = _assemble(checkpoint, table, model_class, ours, computed, ignored=ignored)
    head = {"kind": kind, "task": task, "n_class": ours.num_labels, "num_choices": 2,
            "use_proj": ours.summary_use_proj, "start_n_top": ours.start_n_top, "end_n_top": ours.end_n_top}
    spec = {**ours.to_dict(), "n_token": ours.vocab_size, "untie_r": untie_r,
            "ff_activation": "relu" if ours.ff_activation == "relu" else "gelu", "mem_len": ours.mem_len or 512}

    compare = partial(_compare_xlnet, spec=spec, head=head, prefix=checkpoint.prefix)
    described = "language model" if kind == "lm" else f"{kind} head" + (f" {task!r}" if kind != task else "")
    return _converted(checkpoint, model_class, ours, state, f"XLNet {described}, zihangdai/xlnet", compare)


def _compare_xlnet(model, spec, head, prefix) -> float:
    """The original graph (tf_reference) and `model` on a sample input: max |difference| of the outputs (language
    model: logits and memories over two segments; heads: their outputs on one batch with two segments of text)."""
    from . import tf_reference

    vocab, length = spec["n_token"], 6
    model.eval()
    if head["kind"] == "lm":
        segments = [_sample_ids(vocab, (2, length), seed) for seed in (0, 1)]
        feeds = [{"input_ids": s.t().numpy().astype("int32")} for s in segments]
        expected = tf_reference.run_xlnet(spec, [head], feeds, checkpoint=prefix)
        difference, mems = 0.0, None
        with torch.no_grad():
            for segment, reference in zip(segments, expected):
                output = model(segment, mems=mems, use_mems=True)
                mems = output.mems
                difference = max(
                    difference,
                    (output.logits - torch.from_numpy(reference["lm"]).transpose(0, 1)).abs().max().item(),
                    max((ours - torch.from_numpy(theirs)).abs().max().item()
                        for ours, theirs in zip(mems, reference["mems"])),
                )
        return difference

    batch = 2 * head["num_choices"] if head["kind"] == "race" else 2
    ids = _sample_ids(vocab, (batch, length))
    types = (torch.arange(length) >= length // 2).long().expand(batch, -1)
    inputs = {"input_ids": ids.t().numpy().astype("int32"), "seg_ids": types.t().numpy().astype("int32")}
    if head["kind"] == "squad":
        inputs["p_mask"] = torch.zeros(batch, length).numpy()
        inputs["cls_index"] = torch.full((batch,), length - 1).numpy().astype("int32")
    reference = tf_reference.run_xlnet(spec, [head], [inputs], checkpoint=prefix)[0]
    with torch.no_grad():
        if head["kind"] == "race":
            logits = model(ids.view(-1, head["num_choices"], length),
                           token_type_ids=types.reshape(-1, head["num_choices"], length)).logits
            return (logits - torch.from_numpy(reference["race"])).abs().max().item()
        output = model(ids, token_type_ids=types)
    if head["kind"] in ("classification", "regression"):
        theirs = torch.from_numpy(reference[f"{head['kind']}_{head['task']}"])
        return (output.logits.view(theirs.shape) - theirs).abs().max().item()
    return squad_difference(output, reference, head["start_n_top"], head["end_n_top"])


def squad_difference(output, reference, start_n_top, end_n_top) -> float:
    """Max |difference| between our XLNetForQuestionAnswering inference outputs and the original's (tf_reference
    keys "squad/..."); inf where the chosen start / end indices differ.

    Two differences of form, both as in transformers' XLNet: ours returns probabilities where the original returns
    log-probabilities (under the same `*_log_probs` names), and flattens the end candidates end-major
    ([k_end, k_start]) where the original is start-major ([k_start, k_end])."""

    def start_major(tensor):
        return tensor.view(-1, end_n_top, start_n_top).transpose(1, 2).reshape(-1, start_n_top * end_n_top)

    pairs = [
        (output.start_top_log_probs, reference["squad/start_top_log_probs"], output.start_top_index,
         reference["squad/start_top_index"]),
        (start_major(output.end_top_log_probs), reference["squad/end_top_log_probs"],
         start_major(output.end_top_index), reference["squad/end_top_index"]),
    ]
    difference = (output.cls_logits - torch.from_numpy(reference["squad/cls_logits"])).abs().max().item()
    for probs, log_probs, index, expected_index in pairs:
        if not torch.equal(index, torch.from_numpy(expected_index).long()):
            return float("inf")
        difference = max(difference, (probs - torch.from_numpy(log_probs).exp()).abs().max().item())
    return difference


# ----- entry point ------------------------------------------------------------------------------------------------


def read_tf_checkpoint(source, config=None, corpus_info=None, task=None) -> ConvertedCheckpoint:
    """Reads an original TF checkpoint of Transformer-XL or XLNet (the kind is recognised from the variable names).

    - `source`: a checkpoint prefix (`.../model.ckpt-1000`, beside its `.index` / `.data-*` files) or a folder with
      a `checkpoint` state file;
    - `config`: Transformer-XL: the flags of kimiyoung tf/train_gpu.py as JSON (then `corpus_info`, the
      corpus-info.json of its data_utils.py, gives the vocabulary size and cutoffs) or a transformers config.json
      (which may add `proj_same_dim`); XLNet: the released xlnet_config.json (optionally with run-time settings such
      as mem_len, clamp_len, summary_type, start_n_top) or a transformers config.json. A path or a dict;
    - `task`: for XLNet checkpoints holding several heads, which one ("mnli", "squad", "race", ... or "lm").

    The Transformer-XL graph always ties its softmax weights to the embeddings (the `tie_weight` flag is unused).
    """
    checkpoint = TFCheckpoint(checkpoint_prefix(source))
    kind = _model_kind(checkpoint.entries)
    if kind == "transfo-xl":
        if task is not None:
            raise ValueError(f"--task {task!r} applies to XLNet checkpoints; this is a Transformer-XL checkpoint")
        return _read_transfo_xl(checkpoint, config, corpus_info)
    if corpus_info is not None:
        raise ValueError("--corpus-info applies to Transformer-XL checkpoints; this is an XLNet checkpoint")
    return _read_xlnet(checkpoint, config, task)
