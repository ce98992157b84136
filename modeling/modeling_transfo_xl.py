"""Transformer-XL (Dai et al. 2019): a decoder whose layers attend over [memory; segment], the memory holding each
layer's inputs from earlier segments, detached (segment-level recurrence, Sec. 3.2); positions enter attention only as
relative distances (Sec. 3.3). Parameter names are transformers 4.x `TransfoXL*`'s: legacy checkpoints load as they
are. `mems[i]` (in and out): layer i's last `mem_len` inputs, time-major [mem_len, batch, d_model] as in the legacy
API; inside, tensors are batch-first."""

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel, StopStringCriteria
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .configuration_transfo_xl import TransfoXLConfig
from .input_checks import IGNORE_INDEX, check_inputs, check_sequence_labels, check_token_labels, inputs_shape, problem_type
from .memory_cache import MemoryCache, MemoryLayer, StaticMemoryCache, key_values_over
from .relative_attention import (
    ALL_ATTENTION_FUNCTIONS, attention_implementation, causal_memory_mask, cross_entropy, distance_scores,
    eager_attention_forward, mask_scores_, flex_mask, pad_to_block, relative_shift, sinusoid_encoding,
    sinusoid_inverse_frequencies,
)


@dataclass
class TransfoXLModelOutput(ModelOutput):
    """Base model output. `mems`: the next segment's memory (see the module docstring for the layout)."""

    last_hidden_state: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class TransfoXLLMHeadModelOutput(ModelOutput):
    """LM output. Position t predicts `labels[:, t + 1]` (shifted inside) or `shift_labels[:, t]`.

    - `loss`: mean NLL over the predicted tokens whose label is not -100 (a scalar, as Trainer expects);
    - `losses`: per-token NLL [batch, seq_len - 1] (`shift_labels`: [batch, seq_len]), 0 where the label is -100;
    - `logits`: log-probabilities [batch, seq_len, vocab_size], only without labels (the loss never needs them).
    """

    loss: torch.FloatTensor | None = None
    losses: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    cache: MemoryCache | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None

    @property
    def prediction_scores(self):
        """The legacy name of `logits`."""
        return self.logits

    def __getitem__(self, key):
        return super().__getitem__("logits" if key == "prediction_scores" else key)


@dataclass
class TransfoXLSequenceClassifierOutputWithPast(ModelOutput):
    loss: torch.FloatTensor | None = None
    logits: torch.FloatTensor | None = None
    mems: tuple[torch.FloatTensor, ...] | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


# ----------------------------------------------------------------------------------------------------------------
# Adaptive input embedding and projected adaptive softmax (Baevski & Auli 2019; Grave et al. 2017)
#
# The vocabulary is split by `cutoffs` into a head cluster (frequent ids) and tail clusters. Cluster i embeds its ids
# in `d_embed // div_val**i` dimensions and projects them to the model width; the output distribution factorises as
# p(w) = p(cluster | h) p(w | cluster, h): the head softmax scores the head ids plus one logit per tail cluster.
# Parameter names (`emb_layers`, `emb_projs`, `out_layers`, `out_projs`, `cluster_weight`, `cluster_bias`) are those
# of the legacy checkpoints. Projections are stored [d_proj, d_emb] and applied as `x @ proj` (output side) or
# `F.linear(x, proj)` (input side).


def cluster_bounds(vocab_size: int, cutoffs: list[int]) -> list[tuple[int, int]]:
    """[(start, end)] id range of each cluster: head first, then the tails."""
    ends = [0] + list(cutoffs) + [vocab_size]
    return list(zip(ends[:-1], ends[1:]))


def resized_bounds(bounds: list[tuple[int, int]], vocab_size: int) -> list[tuple[int, int]]:
    """`bounds` with the last cluster ending at `vocab_size` (the cutoffs, hence the other clusters, unchanged)."""
    return bounds[:-1] + [(bounds[-1][0], vocab_size)]


def cluster_dims(d_embed: int, div_val: int, num_clusters: int) -> list[int]:
    """Embedding width of each cluster: d_embed / div_val^i (all d_embed when div_val == 1)."""
    return [d_embed // (div_val**i) for i in range(num_clusters)]


class AdaptiveEmbedding(nn.Module):
    """Token ids -> [.., d_proj] embeddings scaled by sqrt(d_proj), one table and projection per cluster."""

    def __init__(self, vocab_size, d_embed, d_proj, cutoffs, div_val=1, sparse=False):
        super().__init__()
        self.vocab_size, self.d_proj, self.div_val = vocab_size, d_proj, div_val
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.emb_scale = d_proj**0.5
        self.emb_layers = nn.ModuleList()
        self.emb_projs = nn.ParameterList()
        if div_val == 1:
            # One table for the whole vocabulary; a projection only when widths differ.
            self.emb_layers.append(nn.Embedding(vocab_size, d_embed, sparse=sparse))
            if d_proj != d_embed:
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)))
        else:
            for (start, end), dim in zip(self.bounds, cluster_dims(d_embed, div_val, len(self.bounds))):
                self.emb_layers.append(nn.Embedding(end - start, dim))
                self.emb_projs.append(nn.Parameter(torch.empty(d_proj, dim)))

    @property
    def weight(self) -> torch.Tensor:
        return self.emb_layers[0].weight

    def resize(self, vocab_size: int, resize_table):
        """Make the last cluster end at `vocab_size`: `resize_table(table, rows)` gives the last table with `rows`
        rows, its old rows first."""
        first_id = self.bounds[-1][0] if self.div_val > 1 else 0
        self.emb_layers[-1] = resize_table(self.emb_layers[-1], vocab_size - first_id)
        self.vocab_size, self.bounds = vocab_size, resized_bounds(self.bounds, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            embeddings = self.emb_layers[0](input_ids)
            if len(self.emb_projs):
                embeddings = F.linear(embeddings, self.emb_projs[0])
            return embeddings * self.emb_scale
        # Every cluster embeds every id (clamped into its range) and keeps its own ids' rows: no data-dependent row
        # selection, hence no host sync; the tables and projections are small beside the model.
        embeddings = None
        for (start, end), table, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
            cluster = F.linear(table((input_ids - start).clamp(0, end - start - 1)), proj)
            inside = ((input_ids >= start) & (input_ids < end))[..., None]
            embeddings = cluster if embeddings is None else torch.where(inside, cluster, embeddings)
        return embeddings * self.emb_scale


class SoftmaxLayer(nn.Module):
    """nn.Linear but its class, which peft's `all-linear` would adapt (and merge into the tied embedding)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight, self.bias = nn.Linear(in_features, out_features).parameters()

    forward = nn.Linear.forward


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Hidden states -> log-probabilities over the vocabulary, or the NLL of targets. The head softmax covers
    `cutoffs[0]` ids and one logit per tail cluster: log p(id in tail i) = log p(cluster i) (head column
    `cutoffs[0] + i - 1`) + log p(id | cluster i) (the legacy `log_prob()` read column `-i` and mis-sliced)."""

    def __init__(self, vocab_size, d_embed, d_proj, cutoffs, div_val=1):
        super().__init__()
        self.vocab_size, self.div_val = vocab_size, div_val
        self.bounds = cluster_bounds(vocab_size, cutoffs)
        self.head_size = self.bounds[0][1] + len(cutoffs)
        if cutoffs:
            self.cluster_weight = nn.Parameter(torch.empty(len(cutoffs), d_embed))
            self.cluster_bias = nn.Parameter(torch.empty(len(cutoffs)))
        self.out_layers = nn.ModuleList()
        self.out_projs = nn.ParameterList()
        if div_val == 1:
            # One output layer sliced per cluster; each cluster may still have its own projection.
            self.out_layers.append(SoftmaxLayer(d_embed, vocab_size))
            for _ in self.bounds:
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)) if d_proj != d_embed else None)
        else:
            for (start, end), dim in zip(self.bounds, cluster_dims(d_embed, div_val, len(self.bounds))):
                self.out_layers.append(SoftmaxLayer(dim, end - start))
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, dim)))

    @property
    def weight(self) -> torch.Tensor:
        return self.out_layers[0].weight

    def resize(self, vocab_size: int, resize_layer):
        """As AdaptiveEmbedding.resize: `resize_layer(linear, rows)`, the last as an nn.Linear. The head
        softmax is unchanged (unless the head is the only cluster)."""
        first_id = self.bounds[-1][0] if self.div_val > 1 else 0
        layer, linear = self.out_layers[-1], nn.Linear(1, 1, device="meta")
        linear.weight, linear.bias = layer.weight, layer.bias
        layer.weight, layer.bias = resize_layer(linear, vocab_size - first_id).parameters()
        self.vocab_size, self.bounds = vocab_size, resized_bounds(self.bounds, vocab_size)
        self.head_size = self.bounds[0][1] + len(self.bounds) - 1

    def _clusters(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """(weight, bias) of every cluster, head first; None for quantized or replaced layers (called, not read).
        div_val 1 splits the one layer (a slice's gradient would be a full-vocabulary tensor per cluster)."""
        if any(type(layer) is not SoftmaxLayer or type(layer.weight) is not nn.Parameter for layer in self.out_layers):
            return None
        if self.div_val == 1:
            sizes = [end - start for start, end in self.bounds]
            return list(zip(self.out_layers[0].weight.split(sizes), self.out_layers[0].bias.split(sizes)))
        return [(layer.weight, layer.bias) for layer in self.out_layers]

    def _logits(self, hidden: torch.Tensor, clusters, cluster: int) -> torch.Tensor:
        """Cluster `cluster`'s logits [N, size] (the head's: its words, then one logit per tail cluster), in fp32 or
        wider. `clusters` is `_clusters()`."""
        proj = self.out_projs[cluster]
        projected = hidden if proj is None else hidden @ proj
        if clusters is not None:
            logits = F.linear(projected, *clusters[cluster])
        else:  # (a called layer gives all its rows: with div_val 1 the whole vocabulary's, sliced)
            logits = self.out_layers[0 if self.div_val == 1 else cluster](projected)
            if self.div_val == 1:
                logits = logits[:, self.bounds[cluster][0] : self.bounds[cluster][1]]
        if cluster == 0 and len(self.bounds) > 1:
            cluster_logits = F.linear(projected, self.cluster_weight, self.cluster_bias)
            logits = torch.cat([logits, cluster_logits.to(logits.dtype)], dim=-1)
        return logits.to(torch.promote_types(logits.dtype, torch.float32))

    def log_prob(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d_proj] -> [N, vocab_size] log-probabilities (computed in fp32, or fp64).

        log p(w) = log_softmax(head logits) for a head word; log p(cluster | h) + log_softmax(cluster logits) for a
        tail word."""
        head_end, clusters = self.bounds[0][1], self._clusters()
        head = torch.log_softmax(self._logits(hidden, clusters, 0), dim=-1)
        pieces = [head[:, :head_end]]
        for cluster in range(1, len(self.bounds)):
            tail = torch.log_softmax(self._logits(hidden, clusters, cluster), dim=-1)
            pieces.append(tail + head[:, head_end + cluster - 1, None])
        return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]

    def nll(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """[N, d_proj], [N] -> [N] NLL of each target (fp32 or wider): -log p(w) = -log p(cluster | h) - log p(w |
        cluster, h), the head's cross-entropy plus, for a tail word, its cluster's, over the rows whose target is
        there (never an [N, vocabulary] tensor; one host sync per tail cluster; a compiled graph, which cannot size
        a tensor by the data, scores every row in every cluster). The logits are overwritten (`cross_entropy`)."""
        head_end, clusters = self.bounds[0][1], self._clusters()
        cluster_of = torch.zeros_like(target)  # 0 for the head, c for tail cluster c (no table copied to the device)
        for _, end in self.bounds[:-1]:
            cluster_of = cluster_of + (target >= end)
        head_target = target.where(cluster_of == 0, head_end - 1 + cluster_of)
        nll = cross_entropy(self._logits(hidden, clusters, 0), head_target, overwrite=True)
        for cluster in range(1, len(self.bounds)):
            start, end = self.bounds[cluster]
            if torch.compiler.is_compiling():
                tail_target = (target - start).clamp(0, end - start - 1)
                tail = cross_entropy(self._logits(hidden, clusters, cluster), tail_target, overwrite=True)
                nll = nll + tail.where(cluster_of == cluster, 0.0)
            else:
                rows = (cluster_of == cluster).nonzero().squeeze(-1)
                tail = cross_entropy(self._logits(hidden[rows], clusters, cluster), target[rows] - start,
                                     overwrite=True)  # fmt: skip
                nll = nll.index_add(0, rows, tail)
        return nll


class LogUniformSampler:
    """The original's negative sampler (`sample_softmax > 0`; ids sorted by frequency): log-uniform draws, P(k) =
    log((k+2)/(k+1)) / log(V+1); `log_q`: log P(an id is among 2 n_sample draws) (Jean et al. 2015)."""

    def __init__(self, vocab_size: int, n_sample: int):
        log_indices = torch.arange(1.0, vocab_size + 2.0).log()
        self.dist = (log_indices[1:] - log_indices[:-1]) / log_indices[-1]
        self.log_q = (-(-self.dist.double().log1p() * 2 * n_sample).expm1()).log().float()
        self.n_sample = n_sample

    def sample(self, labels: torch.Tensor):
        """(log q of the labels, log q of the negatives, the unique negative ids)."""
        negatives = torch.multinomial(self.dist, 2 * self.n_sample, replacement=True).unique().to(labels.device)
        log_q = self.log_q.to(labels.device)
        return log_q[labels], log_q[negatives], negatives


def sampled_softmax_nll(embedding, bias, labels, hidden, sampler):
    """NLL of `labels` [N] under a softmax over the label and shared log-uniform negatives (training only): scores
    from the tied input embedding and a per-id output bias, less log q (Jean et al. 2015); negatives equal to the
    label are removed."""
    true_log_q, sample_log_q, negatives = sampler.sample(labels)
    true_w, sample_w = embedding(labels), embedding(negatives)
    true_logit = (true_w * hidden).sum(-1) + bias[labels] - true_log_q
    sample_logit = hidden @ sample_w.t() + bias[negatives] - sample_log_q
    sample_logit = sample_logit.masked_fill(labels[:, None] == negatives, torch.finfo(sample_logit.dtype).min)
    logits = torch.cat([true_logit[:, None], sample_logit], dim=-1)
    return -torch.log_softmax(logits.float(), dim=-1)[:, 0]


def loss_per_target(total: torch.Tensor, count) -> torch.Tensor:
    """A summed loss divided by its number of targets `count` (an int or a tensor, e.g. Trainer's
    `num_items_in_batch`); 0 when there is none (every label -100), where 0 / 0 would put NaN into every gradient."""
    if torch.is_tensor(count):
        return total / count.to(total.device).clamp(min=1)
    return total / max(count, 1)


class TransfoXLPositionalEmbedding(nn.Module):
    """Sinusoid encodings of relative distances (Sec. 3.3: R is a sinusoid matrix without learnable parameters)."""

    def __init__(self, d_model):
        super().__init__()
        self.register_buffer("inv_freq", sinusoid_inverse_frequencies(d_model))  # persistent: legacy files hold it

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return sinusoid_encoding(positions, self.inv_freq)


class TransfoXLAttention(nn.Module):
    """Multi-head attention of a segment over [memory; segment]. attn_type 0 scores Dai et al.'s terms (a)-(d),
    `(q + u) k + shift((q + v) W_R R)`; 1 (Shaw et al.) `(q + u) k + shift(q r_emb + r_bias)`; 2 and 3 add absolute
    positions to the inputs (TransfoXLLayer) and score `q k`. The attention is `config._attn_implementation`'s, the
    position terms and the mask one additive score bias (`score_bias_arguments`)."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__()
        self.config = config  # (read at every call: `set_attn_implementation` takes effect at the next one)
        self.n_head, self.d_head = config.n_head, config.d_head
        self.attn_type, self.pre_lnorm = config.attn_type, config.pre_lnorm
        self.scale = config.d_head**-0.5
        inner = config.n_head * config.d_head
        self.qkv_net = nn.Linear(config.d_model, 3 * inner, bias=False)
        self.o_net = nn.Linear(inner, config.d_model, bias=False)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)
        self.drop = nn.Dropout(config.dropout)
        self.dropatt = config.dropatt
        if config.attn_type == 0:
            self.r_net = nn.Linear(config.d_model, inner, bias=False)
            if config.untie_r:
                self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
                self.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
        elif config.attn_type == 1:
            max_klen = config.tgt_len + config.ext_len + config.mem_len
            self.r_emb = nn.Parameter(torch.empty(max_klen, config.n_head, config.d_head))
            self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self.r_bias = nn.Parameter(torch.empty(max_klen, config.n_head))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, L, H * D] -> [B, H, L, D]."""
        return x.view(*x.shape[:2], self.n_head, self.d_head).transpose(1, 2)

    def project_keys_values(self, context: torch.Tensor):
        """Keys and values [B, H, L, D] of layer inputs `context` (normalised first under pre-LN)."""
        if self.pre_lnorm:
            context = self.layer_norm(context)
        if type(self.qkv_net) is nn.Linear and type(self.qkv_net.weight) is nn.Parameter:
            # (only the key and value rows of the weight: the memory's queries are never used)
            key, value = F.linear(context, self.qkv_net.weight[self.n_head * self.d_head :]).chunk(2, dim=-1)
        else:  # (a quantized or replaced layer is called whole)
            key, value = self.qkv_net(context).chunk(3, dim=-1)[1:]
        return self._heads(key), self._heads(value)

    def project_positions(self, position_embedding: torch.Tensor) -> torch.Tensor:
        """W_{k,R} R / sqrt(D): [R, d_model] relative encodings -> [H, R, D] position keys, pre-scaled so that the
        shifted scores are the attention's score term as they are."""
        keys = self.r_net(position_embedding) * self.scale
        return keys.view(-1, self.n_head, self.d_head).transpose(0, 1)

    def _position_scores(self, query, key_length, position_keys, r_r_bias, pad):
        """Terms (b)+(d), scaled by 1/sqrt(D), per distance: [B, H, q, R] over distances k-1 ... -1 (or lower: -1 on
        is read only by masked keys), None for absolute types; key j of query i is at distance (k - q + i) - j, hence
        the shift offset q - 1. `pad`: q and R rounded up for flex_attention (`pad_to_block`)."""
        if self.attn_type == 0:
            position_query = query + r_r_bias[:, None, :].to(query.dtype)  # (q + v)
            return distance_scores(pad(position_query), pad(position_keys.to(query.dtype)))
        if self.attn_type == 1:
            r_emb, r_bias = self.r_emb, self.r_bias
            if key_length > r_emb.shape[0]:  # distances beyond the table reuse its farthest entry
                extra = key_length - r_emb.shape[0]
                r_emb = torch.cat([r_emb[:1].expand(extra, -1, -1), r_emb])
                r_bias = torch.cat([r_bias[:1].expand(extra, -1), r_bias])
            r_emb, r_bias = r_emb[-key_length:], r_bias[-key_length:]
            scores = torch.matmul(query, r_emb.permute(1, 2, 0).to(query.dtype)) + r_bias.t()[:, None, :]
            return pad(F.pad(scores * self.scale, (0, 1)), -2, -1)
        return None

    def _slot_position_scores(self, query, position_keys, slot_distances, r_r_bias):
        """Terms (b)+(d) of a static cache's step (attn_type 0): the one query scored against every distance
        R-1 ... 0 of `position_keys` [H, R, D], then taken per key slot by its distance (`slot_distances` [R]):
        the ring buffer's keys are in slot order, not in distance order, so this replaces the relative shift."""
        position_query = query + r_r_bias[:, None, :].to(query.dtype)  # (q + v)
        by_distance = distance_scores(position_query, position_keys.to(query.dtype))
        return by_distance.index_select(-1, by_distance.shape[-1] - 1 - slot_distances)

    def forward(
        self, hidden: torch.Tensor, memory: torch.Tensor | None, cached_memory: MemoryLayer | None,
        positions: Callable | None, mask: torch.Tensor, biases: tuple[torch.Tensor, torch.Tensor] | None,
        output_attentions: bool = False, slot_distances: torch.Tensor | None = None,
    ):  # fmt: skip
        """hidden [B, q, d], memory [B, m, d] | None -> (output [B, q, d], probabilities | None, (keys, values) over
        [memory; segment]). `cached_memory`: a cache layer whose memory keys / values are reused; `positions`: see
        `TransfoXLModel._positions`; `mask` [B|1, 1, q, k]: True where i may not attend j; `slot_distances` [k]: a
        static cache step's key distances."""
        batch_size, query_length = hidden.shape[:2]
        normed = self.layer_norm(hidden) if self.pre_lnorm else hidden
        query, key, value = map(self._heads, self.qkv_net(normed).chunk(3, dim=-1))
        if cached_memory is not None:
            key, value = cached_memory.key_values_with(key, value)
        else:
            key, value = key_values_over(memory, key, value, self.project_keys_values)

        position_keys = None if positions is None else positions(self.project_positions)
        r_w_bias, r_r_bias = biases if biases is not None else (getattr(self, "r_w_bias", None), None)
        if self.attn_type == 0 and biases is None:
            r_r_bias = self.r_r_bias
        dropout = self.dropatt if self.training else 0.0
        implementation = attention_implementation(self.config, output_attentions, dropout, hidden.device)
        flex = implementation == "flex_attention"
        if slot_distances is not None:  # (scores per key slot: unshifted)
            position_scores = self._slot_position_scores(query, position_keys, slot_distances, r_r_bias)
            if flex:
                position_scores = pad_to_block(position_scores, -2, -1)
        else:
            pad = pad_to_block if flex else lambda x, *dims: x
            position_scores = self._position_scores(query, key.shape[2], position_keys, r_r_bias, pad)
        if flex:  # the position scores read per distance in flex's score_mod
            offset = None if slot_distances is not None or position_scores is None else query_length - 1
            bias = {"position_scores": position_scores, "shift_offset": offset}
        else:  # every score term but (a)+(c), the mask written into them (the shifted scores: a view, no copy)
            if position_scores is None:
                position_scores = query.new_zeros(mask.shape)
            elif slot_distances is None:
                position_scores = relative_shift(position_scores, key.shape[2], query_length - 1)
            bias, mask = {}, mask_scores_(position_scores, mask)
        content_query = query if r_w_bias is None else query + r_w_bias[:, None, :].to(query.dtype)  # (q + u)

        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        # (`content_query @ key`: terms (a)+(c); `mask`: eager's, sdpa's other terms, masked, additive; flex's FlexMask)
        attention, probs = attention_interface(self, content_query, key, value, mask, dropout=dropout,
                                               scaling=self.scale, is_causal=False, **bias)  # fmt: skip
        output = self.drop(self.o_net(attention.reshape(batch_size, query_length, -1)))
        output = hidden + output if self.pre_lnorm else self.layer_norm(hidden + output)
        return output, probs, (key, value)


class TransfoXLFeedForward(nn.Module):
    """Position-wise feed-forward block with residual and (pre- or post-) layer norm; legacy names `CoreNet.{0,3}`."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__()
        self.pre_lnorm = config.pre_lnorm
        self.CoreNet = nn.Sequential(
            nn.Linear(config.d_model, config.d_inner), nn.ReLU(), nn.Dropout(config.dropout),
            nn.Linear(config.d_inner, config.d_model), nn.Dropout(config.dropout),
        )  # fmt: skip
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_epsilon)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.pre_lnorm:
            return hidden + self.CoreNet(self.layer_norm(hidden))
        return self.layer_norm(hidden + self.CoreNet(hidden))


class TransfoXLLayer(GradientCheckpointingLayer):
    """Attention over [memory; segment], then the feed-forward block. attn_type 3 (Al-Rfou et al.) first adds the
    layer's learned absolute positions to its input and memory (the memory stores the inputs without them)."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__()
        self.dec_attn = TransfoXLAttention(config)
        self.pos_ff = TransfoXLFeedForward(config)
        if config.attn_type == 3:
            max_klen = config.tgt_len + config.ext_len + config.mem_len
            self.r_emb = nn.Parameter(torch.empty(max_klen, config.n_head, config.d_head))

    def _add_absolute_positions(self, hidden, memory):
        table = self.r_emb.flatten(1)  # [max_klen, d_model]; the last rows belong to the newest positions
        query_length, memory_length = hidden.shape[1], 0 if memory is None else memory.shape[1]
        key_length = memory_length + query_length
        if table.shape[0] < key_length:  # older positions than the table covers share its first row
            table = torch.cat([table[:1].expand(key_length - table.shape[0], -1), table])
        table = table[table.shape[0] - key_length :]
        hidden = hidden + table[memory_length:]
        if memory_length:
            memory = memory + table[:memory_length]
        return hidden, memory

    def forward(
        self, hidden, memory=None, cached_memory=None, positions=None, mask=None, biases=None, output_attentions=False,
        slot_distances=None,
    ):  # fmt: skip
        if hasattr(self, "r_emb"):
            hidden, memory = self._add_absolute_positions(hidden, memory)
            cached_memory = None  # the memory's keys depend on this segment's position offsets
        output, probs, key_values = self.dec_attn(
            hidden, memory, cached_memory, positions, mask, biases, output_attentions, slot_distances
        )
        return self.pos_ff(output), probs, key_values


class TransfoXLPreTrainedModel(PreTrainedModel):
    config_class = TransfoXLConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransfoXLLayer"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """The memory is not a key/value cache: `generate` must not substitute a DynamicCache for it."""
        return False

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        """Resize the vocabulary at its end, the last adaptive cluster (e.g. for special tokens); the other clusters
        stay. New rows start as transformers starts them (`mean_resizing`); ties stay. Shrinking keeps >= 1 id."""
        embedding = self.get_input_embeddings()
        if new_num_tokens is None and pad_to_multiple_of is None:
            return embedding
        vocab_size = self.config.vocab_size if new_num_tokens is None else new_num_tokens
        if pad_to_multiple_of is not None:
            vocab_size = -(-vocab_size // pad_to_multiple_of) * pad_to_multiple_of
        last_start = embedding.bounds[-1][0]
        if not isinstance(vocab_size, int) or vocab_size <= last_start:
            raise ValueError(
                f"{type(self).__name__}.resize_token_embeddings: got new_num_tokens={new_num_tokens!r}; expected an "
                f"integer above {last_start}: resizing changes the last adaptive cluster (ids {last_start} to "
                f"{self.config.vocab_size - 1}), which must keep at least one id (`cutoffs` = {self.config.cutoffs})."
            )
        if vocab_size != self.config.vocab_size:
            # Output layers first: a weight tied to the embedding still has its old rows, to resize with its bias.
            self._resize_output_layers(vocab_size, mean_resizing)
            embedding.resize(
                vocab_size, lambda table, rows: self._get_resized_embeddings(table, rows, mean_resizing=mean_resizing)
            )
            self.config.vocab_size = vocab_size
            self.tie_weights()
        return embedding

    def _resize_output_layers(self, vocab_size: int, mean_resizing: bool):
        """Heads that score the vocabulary resize their output layers here; the others have none."""

    def _init_weights(self, module):
        """The original code's initialisation (`weights_init` in kimiyoung/transformer-xl)."""
        config = self.config

        def init_weight(tensor):
            if config.init == "uniform":
                init.uniform_(tensor, -config.init_range, config.init_range)
            else:
                init.normal_(tensor, 0.0, config.init_std)

        if isinstance(module, (nn.Linear, SoftmaxLayer)):
            init_weight(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init_weight(module.weight)
        elif isinstance(module, nn.LayerNorm):
            init.normal_(module.weight, 1.0, config.init_std)
            init.zeros_(module.bias)
        elif isinstance(module, nn.ParameterList):  # the adaptive embedding's and softmax's projections
            for proj in module:
                if proj is not None:
                    init.normal_(proj, 0.0, config.proj_init_std)
        elif isinstance(module, ProjectedAdaptiveLogSoftmax):
            if hasattr(module, "cluster_weight"):
                init_weight(module.cluster_weight)
                init.zeros_(module.cluster_bias)
        elif isinstance(module, TransfoXLPositionalEmbedding):
            init.copy_(module.inv_freq, sinusoid_inverse_frequencies(module.inv_freq.shape[0] * 2))
        elif isinstance(module, (TransfoXLAttention, TransfoXLLayer, TransfoXLModel)):
            for name in ("r_w_bias", "r_r_bias", "r_emb"):
                if isinstance(getattr(module, name, None), nn.Parameter):
                    init_weight(getattr(module, name))
            if isinstance(getattr(module, "r_bias", None), nn.Parameter):
                init.zeros_(module.r_bias)
        elif isinstance(module, TransfoXLLMHeadModel) and module.out_bias is not None:
            init.zeros_(module.out_bias)


class TransfoXLModel(TransfoXLPreTrainedModel):
    """Adaptive input embedding -> n_layer decoder layers over [memory; segment] -> hidden states and new memory."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        config._check_fields()  # again: fields edited since the config was built fail here, clearly
        self.word_emb = AdaptiveEmbedding(config.vocab_size, config.d_embed, config.d_model, config.cutoffs,
                                          div_val=config.div_val, sparse=config.sample_softmax > 0)  # fmt: skip
        self.drop = nn.Dropout(config.dropout)
        if config.attn_type in (0, 2):
            self.pos_emb = TransfoXLPositionalEmbedding(config.d_model)
        if config.attn_type == 0 and not config.untie_r:
            # One pair of u / v biases shared by all layers. Legacy files also store a copy under every layer.
            self.r_w_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self.r_r_bias = nn.Parameter(torch.empty(config.n_head, config.d_head))
            self._keys_to_ignore_on_load_unexpected = [r"layers\.\d+\.dec_attn\.r_[wr]_bias$"]
        self.layers = nn.ModuleList(TransfoXLLayer(config) for _ in range(config.n_layer))
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.word_emb

    def set_input_embeddings(self, new_embeddings):
        self.word_emb = new_embeddings

    def _memory(self, cache, mems, batch_size, dtype, device) -> MemoryCache:
        """The memory to attend to (see MemoryCache.for_forward); an empty one starts as `mem_len` zero vectors
        when `zero_initial_mems` asks for the legacy behaviour."""
        config = self.config
        cache = MemoryCache.for_forward(
            cache, mems, config.n_layer, config.mem_len, batch_size, config.d_model, "TransfoXLModel", dtype, device
        )
        if cache.memory(0) is None and config.zero_initial_mems and config.mem_len > 0:
            zeros = torch.zeros(batch_size, config.mem_len, config.d_model, dtype=dtype, device=device)
            for layer in cache.layers:
                layer.hidden = zeros
        return cache

    def _attention_mask(self, query_length, memory_length, attention_mask, device):
        """Boolean [B or 1, 1, q, k] mask (True = may not attend): causal over [memory; segment], `same_length`,
        padding. `attention_mask` (1 = token, 0 = pad) covers the segment [B, q] or, as in `generate`, the history
        (its last columns: the newest memory, the segment); memory older than its first column is attended."""
        key_length = memory_length + query_length
        span = self.config.same_length_span
        if span is None:  # the legacy span: the segment less the keys beyond mem_len (sym_max: no branch to export)
            span = query_length - torch.sym_max(key_length - self.config.mem_len, 0)
        mask = causal_memory_mask(query_length, memory_length, self.config.same_length, span, device=device)
        mask = mask[None, None]
        if attention_mask is not None:
            keep = attention_mask.bool()
            if keep.shape[1] >= key_length:
                keep = keep[:, -key_length:]
            elif keep.shape[1] >= query_length:
                keep = F.pad(keep, (key_length - keep.shape[1], 0), value=True)
            else:
                raise ValueError(
                    f"TransfoXLModel: attention_mask has {keep.shape[1]} columns; expected at least the segment length "
                    f"({query_length}): the segment, or the history before it too (memory + segment: {key_length})."
                )
            mask = mask | ~keep[:, None, None, :]
        return mask

    def _position_embedding(self, highest, lowest, dtype, device):
        """Encodings of distances highest ... lowest (clamped at `clamp_len`), with dropout; None for learned schemes.
        Type 0 uses k-1 ... -1 or lower (`_lowest_distance`), type 2 (absolute) k-1 ... 0."""
        if not hasattr(self, "pos_emb"):
            return None
        positions = torch.arange(highest, lowest - 1, -1, dtype=torch.float32, device=device)  # (an integer step: exportable)
        if self.config.clamp_len > 0:
            positions = positions.clamp(max=self.config.clamp_len)
        return self.drop(self.pos_emb(positions).to(dtype))

    def forward(
        self, input_ids: torch.LongTensor | None = None, mems: tuple[torch.FloatTensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None, inputs_embeds: torch.FloatTensor | None = None,
        cache: MemoryCache | None = None, use_cache: bool | None = None, output_attentions: bool | None = None,
        output_hidden_states: bool | None = None, return_dict: bool | None = None,
    ) -> TransfoXLModelOutput | tuple:  # fmt: skip
        """`mems` (legacy tuple) or `cache` (a MemoryCache, updated in place) carry the memory; outputs always
        hold the new `mems`, and the cache itself when `use_cache` is set or a cache was given."""
        config = self.config
        output_attentions = output_attentions if output_attentions is not None else config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = config.output_hidden_states
        return_dict = return_dict if return_dict is not None else config.return_dict
        use_cache = bool(use_cache) or cache is not None
        batch_size, query_length = check_inputs(
            "TransfoXLModel", input_ids, inputs_embeds, config.vocab_size, config.d_model
        )
        if attention_mask is not None and (attention_mask.dim() != 2 or attention_mask.shape[0] != batch_size):
            raise ValueError(
                f"TransfoXLModel: `attention_mask` has shape {tuple(attention_mask.shape)}; expected [batch_size="
                f"{batch_size}, columns]: the segment, or the history before it too (1 = token, 0 = padding)."
            )
        # The memory and the mask are resolved (and checked) before any computation, in the embeddings' dtype.
        hidden_like = inputs_embeds if inputs_embeds is not None else next(self.word_emb.parameters())
        dtype, device = hidden_like.dtype, hidden_like.device
        # Memory keys / values are a fixed projection of the memory: reusable while the weights are frozen (no
        # dropout, no gradient: with gradients, W_k and W_v must see the memory again).
        reuse_projections = not self.training and not torch.is_grad_enabled() and config.attn_type in (0, 1)
        static = isinstance(cache, StaticMemoryCache)
        if static:
            self._check_static_cache(cache, mems, reuse_projections, batch_size, query_length, dtype)
        slot_distances = None  # (a static cache's step: every key slot's distance, see StaticMemoryCache)
        if static and cache.ring:
            slot_distances, key_length = cache.slot_distances(), None  # (the keys: the ring's slots)
            step_attendable = torch.ones(batch_size, 1, dtype=torch.bool, device=device)
            if attention_mask is not None:
                step_attendable = attention_mask[:, -1:].bool()
            mask = self._slot_mask(cache, slot_distances, step_attendable)
        else:
            cache = self._memory(cache, mems, batch_size, dtype, device)
            memory_length = 0 if cache.memory(0) is None else cache.memory(0).shape[1]
            key_length = memory_length + query_length
            mask = self._attention_mask(query_length, memory_length, attention_mask, device)
        dropout = config.dropatt if self.training else 0.0
        if attention_implementation(config, output_attentions, dropout, device) == "flex_attention":
            mask = flex_mask(mask, *mask.shape[-2:], device)  # (once for every layer)
        if input_ids is not None:
            inputs_embeds = self.word_emb(input_ids)
        biases = (self.r_w_bias, self.r_r_bias) if hasattr(self, "r_w_bias") else None
        position_embedding = []  # (made once per forward, projected by each layer; or the encodings of cache misses)
        lowest = None  # (the lowest distance of the position encodings; a static cache's step has its own table)
        if slot_distances is None:
            lowest = 0 if config.attn_type == 2 else self._lowest_distance(query_length, key_length)
        if config.attn_type == 2 or (config.attn_type == 0 and not reuse_projections):
            position_embedding = self._position_embedding(key_length - 1, lowest, inputs_embeds.dtype, device)
        ring = None  # (a static cache's prompt: the encodings of distances mem_len ... 0, each layer's keys of them)
        if static and slot_distances is None:
            ring = self._position_embedding(config.mem_len, 0, dtype, device), []

        hidden = self.drop(inputs_embeds)
        unpositioned = hidden  # layer 0 remembers its inputs without absolute positions: they are re-added per segment
        if config.attn_type == 2:  # vanilla absolute positions: added to the segment and to layer 0's memory
            hidden = hidden + position_embedding[memory_length:]
        kept = query_length - config.ext_len  # the last ext_len tokens are re-fed next time, not remembered

        layer_inputs, all_attentions = [], []
        for i, layer in enumerate(self.layers):
            layer_inputs.append(hidden)
            memory = None if slot_distances is not None else cache.memory(i)
            if config.attn_type == 2 and i == 0 and memory_length:
                memory = memory + position_embedding[:memory_length]
            positions = self._positions(i, key_length, lowest, position_embedding, cache, reuse_projections, ring)
            output, probs, (key, value) = layer(
                hidden, memory=memory, cached_memory=cache.known_key_values(i) if reuse_projections else None,
                positions=positions, mask=mask, biases=biases, output_attentions=output_attentions,
                slot_distances=slot_distances,
            )  # fmt: skip
            if config.mem_len > 0:
                remembered = unpositioned if i == 0 else hidden
                if slot_distances is not None:
                    cache.store(i, remembered)  # (its keys and values are in their slot already)
                elif reuse_projections:
                    end = memory_length + kept
                    cache.store(i, remembered[:, :kept], key[:, :, :end], value[:, :, :end])
                else:
                    cache.store(i, remembered[:, :kept])
            hidden = output
            all_attentions.append(probs)
        hidden = self.drop(hidden)
        if slot_distances is not None:
            cache.advance()
        elif static:  # the prompt has run: its memory moves into the static slots
            self._start_ring(cache, ring[1], attention_mask, device)

        hidden_states = tuple(layer_inputs) + (hidden,) if output_hidden_states else None
        attentions = tuple(all_attentions) if output_attentions else None
        returned_cache = cache if use_cache else None
        # (a static cache's legacy `mems` are read from its slots on demand, `cache.mems`: not at every step)
        new_mems = None if static else cache.mems
        if not return_dict:
            fields = (hidden, new_mems, returned_cache, hidden_states, attentions)
            return tuple(v for v in fields if v is not None)
        return TransfoXLModelOutput(
            last_hidden_state=hidden, mems=new_mems, cache=returned_cache, hidden_states=hidden_states,
            attentions=attentions,
        )  # fmt: skip

    @staticmethod
    def _lowest_distance(query_length, key_length) -> int:
        """The lowest distance attn_type 0's position keys list: -1 (read only by masked keys), or lower so that the
        score rows are a multiple of 8 long (aligned rows store faster). -1 for a decoding step (its cached table
        serves every step) and in traced graphs (a guard on the remainder would compile a graph per remainder)."""
        if torch.compiler.is_compiling() or not isinstance(key_length, int) or query_length == 1:
            return -1
        return -1 - (-(key_length + 1)) % 8

    def _check_static_cache(self, cache, mems, reuse_projections, batch_size, query_length, dtype):
        """What a StaticMemoryCache needs (checked on shapes and flags only: no host sync in a step)."""
        config = self.config
        problem = None
        if config.attn_type != 0 or config.ext_len or cache.mem_len != config.mem_len:
            problem = f"supports attn_type 0, ext_len 0, mem_len {config.mem_len} (the model's) only"
        elif not reuse_projections:
            problem = "decodes in eval mode under torch.no_grad() (as generate() does)"
        elif cache.ring and (mems is not None or query_length != 1):
            problem = f"takes one token per step after the prompt, no `mems`; got {query_length} tokens"
        elif cache.ring and (cache.batch_size, cache.layers[0].hidden.dtype) != (batch_size, dtype):
            problem = f"holds batch {cache.batch_size} in {cache.layers[0].hidden.dtype}; got {batch_size} in {dtype}"
        if problem:
            raise ValueError(f"TransfoXLModel: the static cache {problem}; else use the default cache (MemoryCache).")

    def _slot_mask(self, cache, slot_distances, step_attendable):
        """A static cache step's mask [B, 1, 1, R] (True = may not attend): the slots not written yet, padding
        (`cache.attendable`, this step's token from `step_attendable` [B, 1]) and, with `same_length`, the keys
        beyond the span `_attention_mask` gives one query."""
        config = self.config
        held = cache.position - cache.oldest  # positions before this step's token
        masked = slot_distances > held  # (distance d holds position - d, written only from `oldest` on)
        if config.same_length:
            memory_length = held.clamp(max=config.mem_len)
            span = config.same_length_span
            if span is None:  # (`_attention_mask`'s legacy span for one query)
                span = 1 - (memory_length + 1 - config.mem_len).clamp(min=0)
            masked = masked | (slot_distances >= memory_length + span)
        cache.mark_attendable(step_attendable)
        return masked[None, None, None, :] | ~cache.attendable[:, None, None, :]

    def _start_ring(self, cache, tables, attention_mask, device):
        """After the prompt: the static cache's memory into its slots, with each layer's position keys of distances
        mem_len ... 0 (`tables`) and its padding (`attention_mask`'s columns; older positions attended, as there)."""
        held = cache.memory(0).shape[1]
        attendable = torch.ones(cache.batch_size, held, dtype=torch.bool, device=device)
        if attention_mask is not None:
            columns = attention_mask.bool()[:, -held:]
            attendable[:, held - columns.shape[1] :] = columns
        cache.start_ring(tables, attendable)

    def _positions(self, layer_idx, key_length, lowest, position_embedding, cache, reuse, ring):
        """Layer `layer_idx`'s position keys for distances k-1 ... `lowest` (attn_type 0; else None) as a function of
        its `project_positions`, called in its forward (hooks: FSDP, adapters, see every use of its weights). With
        `reuse`, sliced from the cache's table (`position_embedding`: this forward's encodings, a list); a static
        step's: its ring table. `ring`: a static prompt's (encodings, tables), each layer adding its keys."""
        if self.config.attn_type != 0:
            return None
        if isinstance(cache, StaticMemoryCache) and cache.ring:
            return lambda project: cache.layers[layer_idx].position_keys
        if not reuse:
            return lambda project: project(position_embedding)
        # (the layer's dtype and device, from its layer norm: r_net may be a quantized layer, without a float weight)
        norm = self.layers[layer_idx].dec_attn.layer_norm.weight

        def encodings(span):  # (distances lowest + span - 1 ... lowest)
            if not position_embedding or position_embedding[-1].shape[0] != span:
                position_embedding.append(self._position_embedding(lowest + span - 1, lowest, norm.dtype, norm.device))
            return position_embedding[-1]

        def position_keys(project):
            if ring is not None:
                ring[1].append(project(ring[0]))
            return cache.position_keys(layer_idx, key_length - lowest, lowest, lambda span: project(encodings(span)))

        return position_keys


def _tied_weights(config: TransfoXLConfig, crit: ProjectedAdaptiveLogSoftmax) -> dict[str, str]:
    """{target: source} regexes: softmax layers tied to the embedding tables (`tie_weight`), projections to theirs
    (`tie_projs[i]`; with div_val 1 every cluster shares `emb_projs.0`)."""
    ties = {}
    if config.tie_weight:
        for i in range(len(crit.out_layers)):
            ties[rf"crit\.out_layers\.{i}\.weight$"] = rf"transformer\.word_emb\.emb_layers\.{i}\.weight$"
    for i, tie in enumerate(config.tie_projs):
        if tie and crit.out_projs[i] is not None:
            source = 0 if config.div_val == 1 else i
            ties[rf"crit\.out_projs\.{i}$"] = rf"transformer\.word_emb\.emb_projs\.{source}$"
    return ties


class TransfoXLLMHeadModel(TransfoXLPreTrainedModel, GenerationMixin):
    """Transformer-XL with the projected adaptive softmax (optionally trained with a sampled softmax)."""

    # forward()'s **kwargs take only `shift_labels` (others are a TypeError); tell Trainer it takes `num_items_in_batch`.
    accepts_loss_kwargs = True

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.transformer = TransfoXLModel(config)
        self.crit = ProjectedAdaptiveLogSoftmax(
            config.vocab_size, config.d_embed, config.d_model, config.cutoffs, div_val=config.div_val
        )
        self.out_bias = None
        if config.sample_softmax > 0:
            self.out_bias = nn.Parameter(torch.empty(config.vocab_size))
            self.sampler = LogUniformSampler(config.vocab_size, config.sample_softmax)
        self._tied_weights_keys = _tied_weights(config, self.crit)
        # Labels are shifted inside, like every causal LM: Trainer then counts `num_items_in_batch` over labels[:, 1:].
        self.loss_type = "ForCausalLM"
        self.post_init()

    def forward(
        self, input_ids: torch.LongTensor | None = None, mems: tuple[torch.FloatTensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None, inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None, cache: MemoryCache | None = None, use_cache: bool | None = None,
        output_attentions: bool | None = None, output_hidden_states: bool | None = None,
        return_dict: bool | None = None, logits_to_keep: int = 0, num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> TransfoXLLMHeadModelOutput | tuple:  # fmt: skip
        """`labels`: the input ids (shifted inside; -100: ignored). `shift_labels` [batch, seq_len] (transformers v5's
        causal-LM loss): targets already shifted, the last position predicting the token after the segment (each
        token of a stream predicted once, as in the original; see `TextStream`); passed in `**kwargs`, so that
        Trainer's label column stays `labels`, which they replace. `num_items_in_batch` (Trainer's) normalises the
        loss over accumulated micro-batches.

        `return_dict=False` gives the tuple legacy scripts unpack (4.x's): without labels `(logits, mems, ...)`; with
        labels `(losses, (), mems, ..., loss)`, or `(loss, (), losses, mems, ...)` with `config.trainer_compatible`
        (`()`: 4.x's empty prediction scores). `...`: the cache, hidden states and attentions, those present."""
        shift_labels = kwargs.pop("shift_labels", None)
        if kwargs:
            raise TypeError(f"TransfoXLLMHeadModel.forward() got an unexpected keyword argument '{next(iter(kwargs))}'")
        if shift_labels is not None:
            labels = None  # transformers' contract: `shift_labels` replace `labels` (Trainer's context parallelism)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        shape = inputs_shape(input_ids, inputs_embeds)
        if shape is not None:
            vocab_size = self.config.vocab_size
            check_token_labels(
                "TransfoXLLMHeadModel", labels, shape, "[batch_size, seq_len]", " (the inputs' shape: labels are the "
                "input ids, shifted inside)", vocab_size, "token ids", f" (vocab_size={vocab_size})",
            )
            check_token_labels(
                "TransfoXLLMHeadModel", shift_labels, shape, "[batch_size, seq_len]", " (the inputs' shape: one "
                "target per position)", vocab_size, "token ids", f" (vocab_size={vocab_size})", "shift_labels",
            )
        outputs = self.transformer(
            input_ids, mems=mems, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache,
            use_cache=use_cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            return_dict=True,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        loss = losses = logits = None
        if labels is not None:
            losses, loss = self._losses(hidden[:, :-1], labels[:, 1:], num_items_in_batch)
        elif shift_labels is not None:
            losses, loss = self._losses(hidden, shift_labels, num_items_in_batch)
        else:
            kept = hidden[:, -logits_to_keep:] if logits_to_keep else hidden
            logits = self.crit.log_prob(kept.reshape(-1, kept.shape[-1])).view(*kept.shape[:2], -1)

        if not return_dict:
            rest = (outputs.mems, outputs.cache, outputs.hidden_states, outputs.attentions)
            rest = tuple(v for v in rest if v is not None)
            if losses is None:
                return (logits, *rest)
            if getattr(self.config, "trainer_compatible", False):
                return (loss, (), losses, *rest)
            return (losses, (), *rest, loss)
        return TransfoXLLMHeadModelOutput(
            loss=loss, losses=losses, logits=logits, mems=outputs.mems, cache=outputs.cache,
            hidden_states=outputs.hidden_states, attentions=outputs.attentions,
        )  # fmt: skip

    def get_output_embeddings(self):
        """The adaptive softmax: accelerate's FSDP2 shards it with the input embedding when their `.weight`s are one."""
        return self.crit

    def _resize_output_layers(self, vocab_size: int, mean_resizing: bool):
        """The adaptive softmax's last cluster, and with a sampled softmax its per-id output bias (new ids at 0) and
        sampler."""
        self.crit.resize(
            vocab_size, lambda layer, rows: self._get_resized_lm_head(layer, rows, mean_resizing=mean_resizing)
        )
        if self.out_bias is not None:
            bias = self.out_bias.detach()[:vocab_size]
            self.out_bias = nn.Parameter(F.pad(bias, (0, vocab_size - bias.shape[0])))
            self.sampler = LogUniformSampler(vocab_size, self.config.sample_softmax)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, batch_size, max_length):
        """Start the memory cache before decoding, where transformers' strategies look for it (assisted decoding needs
        it up front): empty, or from the `mems` the user gave, expanded to the beams / return sequences. Without a
        cache (`use_cache=False`) every step recomputes the whole sequence, after those `mems`.
        `cache_implementation="static"` gives a StaticMemoryCache, whose steps generate() can compile: `max_length`
        slots (the cache length; never fewer than the last call's, as StaticCache, so nothing recompiles), at most
        mem_len + 1, which one step attends to (all of them after `mems` or with `zero_initial_mems`)."""
        static = generation_config.cache_implementation == "static"  # (which transformers would ignore for us)
        if static and model_kwargs.get("cache") is not None:
            raise ValueError("TransfoXLLMHeadModel.generate: pass `cache_implementation` or `cache`, not both.")
        if not static:
            super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, batch_size, max_length)
        mems = model_kwargs.pop("mems", None)
        if model_kwargs.get("cache") is not None:
            if mems is not None:
                raise ValueError("TransfoXLLMHeadModel.generate: pass the memory as `cache` or as `mems`, not both.")
            return
        expanded = max(generation_config.num_beams, generation_config.num_return_sequences) * batch_size
        cache_class = StaticMemoryCache if static and generation_config.use_cache is not False else MemoryCache
        cache = (
            cache_class(self.config.n_layer, self.config.mem_len)
            if mems is None
            else cache_class.from_mems(mems, self.config.mem_len, batch_size=expanded)
        )
        if cache_class is StaticMemoryCache and mems is None and not self.config.zero_initial_mems:
            max_length = max(max_length, getattr(self, "_previous_max_cache_length", 0))
            cache.slot_count = self._previous_max_cache_length = min(self.config.mem_len + 1, max_length)
        if generation_config.use_cache is False:
            if cache.mems is not None:
                model_kwargs["mems"] = cache.mems
            return
        if generation_config.is_assistant:  # an assistant's drafts are cropped after every round
            cache.activate_past_recording()
        model_kwargs["cache"] = cache

    def prepare_inputs_for_generation(self, input_ids, inputs_embeds=None, tokenizer=None, **kwargs):
        """transformers' inputs: only the tokens the memory has not seen (or the prompt's `inputs_embeds`), every
        other keyword forwarded except the `tokenizer` generate() takes for stop strings, which comes along.
        A static cache's step gets `attention_mask`'s last column only: the same shapes at every step."""
        inputs = super().prepare_inputs_for_generation(input_ids, inputs_embeds=inputs_embeds, **kwargs)
        cache, attention_mask = inputs.get("cache"), inputs.get("attention_mask")
        if isinstance(cache, StaticMemoryCache) and cache.ring and attention_mask is not None:
            inputs["attention_mask"] = attention_mask[:, -1:].clone(memory_format=torch.contiguous_format)
        return inputs

    def create_masks_for_generate(self, attention_mask=None, **kwargs):
        """generate()'s 4-D mask for a compileable cache: ours stays 2-D (see `TransfoXLModel._slot_mask`)."""
        return attention_mask

    def _get_stopping_criteria(self, generation_config, stopping_criteria, tokenizer=None):
        """transformers' criteria, with `stop_strings` matched by `WordLevelStopStringCriteria`: transformers' own
        cannot learn the text of a word-level vocabulary's tokens (see `stop_strings`)."""
        if generation_config.stop_strings is None or tokenizer is None:  # (transformers explains a missing tokenizer)
            return super()._get_stopping_criteria(generation_config, stopping_criteria, tokenizer)
        without_stop_strings = copy.copy(generation_config)
        without_stop_strings.stop_strings = None
        criteria = super()._get_stopping_criteria(without_stop_strings, stopping_criteria, tokenizer)
        criteria.append(WordLevelStopStringCriteria(tokenizer, generation_config.stop_strings))
        return criteria

    def _losses(self, hidden, target, num_items_in_batch):
        """Per-token NLL [B, T] of `target` given `hidden` [B, T, d], and their mean over the real targets. Ignored
        positions (-100) are scored as id 0 and zeroed: selecting the real ones would cost a host sync."""
        target = target.to(hidden.device)
        valid = target != IGNORE_INDEX
        nll = self._nll(hidden.reshape(-1, hidden.shape[-1]), target.reshape(-1).clamp(min=0))
        losses = nll.view(target.shape).where(valid, 0.0)
        count = num_items_in_batch if num_items_in_batch is not None else valid.sum()
        return losses, loss_per_target(losses.sum(), count)

    def _nll(self, hidden, target):
        """[N, d], [N] -> [N] NLL of the targets: the sampled softmax in training when configured, else exact."""
        if self.out_bias is not None and self.training:
            return sampled_softmax_nll(self.transformer.word_emb, self.out_bias, target, hidden, self.sampler)
        return self.crit.nll(hidden, target)


class TransfoXLForSequenceClassification(TransfoXLPreTrainedModel):
    """Transformer-XL with a linear classifier on the last non-padding token (works for left and right padding)."""

    def __init__(self, config: TransfoXLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = TransfoXLModel(config)
        self.score = nn.Linear(config.d_model, config.num_labels, bias=False)
        self.post_init()

    def _last_token_index(self, input_ids, attention_mask, batch_size, seq_len, device):
        if attention_mask is not None:
            positions = torch.arange(attention_mask.shape[1], device=device)
            return (attention_mask[:, -seq_len:].to(device).bool() * positions[-seq_len:]).argmax(-1) - (
                attention_mask.shape[1] - seq_len
            )
        if input_ids is not None and self.config.pad_token_id is not None:
            is_token = input_ids != self.config.pad_token_id
            return (is_token * torch.arange(seq_len, device=device)).argmax(-1)
        return torch.full((batch_size,), seq_len - 1, device=device)

    def forward(
        self, input_ids: torch.LongTensor | None = None, mems: tuple[torch.FloatTensor, ...] | None = None,
        attention_mask: torch.Tensor | None = None, inputs_embeds: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None, output_attentions: bool | None = None,
        output_hidden_states: bool | None = None, return_dict: bool | None = None, cache: MemoryCache | None = None,
    ) -> TransfoXLSequenceClassifierOutputWithPast | tuple:  # fmt: skip
        """`cache`: a MemoryCache holding the memory instead of `mems`, updated in place (as in the LM head)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        shape = inputs_shape(input_ids, inputs_embeds)
        if labels is not None and shape is not None:
            check_sequence_labels("TransfoXLForSequenceClassification", self.config, labels, shape[0])
        outputs = self.transformer(
            input_ids, mems=mems, attention_mask=attention_mask, inputs_embeds=inputs_embeds, cache=cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )  # fmt: skip
        hidden = outputs.last_hidden_state
        batch_size, seq_len = hidden.shape[:2]
        last = self._last_token_index(input_ids, attention_mask, batch_size, seq_len, hidden.device)
        logits = self.score(hidden[torch.arange(batch_size, device=hidden.device), last])
        loss = None
        if labels is not None and problem_type(self.config, labels) == "single_label_classification":
            # (transformers' loss_function is a mean over the labels that are not -100: NaN when none is)
            labels = labels.view(-1)
            total = F.cross_entropy(logits, labels, reduction="sum", ignore_index=IGNORE_INDEX)
            loss = loss_per_target(total, (labels != IGNORE_INDEX).sum())
        elif labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        if not return_dict:
            fields = (loss, logits, outputs.mems, outputs.hidden_states, outputs.attentions)
            return tuple(v for v in fields if v is not None)
        return TransfoXLSequenceClassifierOutputWithPast(
            loss=loss, logits=logits, mems=outputs.mems, hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Stop strings (`generate(..., stop_strings=[...], tokenizer=tokenizer)`) for word-level vocabularies.
#
# transformers' `StopStringCriteria` learns the text each vocabulary token adds to a generation by decoding the token
# after a probe word, "abcdef", that it encodes with the tokenizer itself, then cutting everything up to the probe
# off the decoded text. A closed word-level vocabulary (Transformer-XL's) has no such word: the probe encodes as
# `<unk>`, and the criteria fail with "substring not found". Here the probe is a word the tokenizer gives back.


def probe_word(tokenizer, default: str = "abcdef") -> str:
    """`default` if the tokenizer gives it back after encoding and decoding it, else the most frequent (lowest-id)
    alphabetic word of the vocabulary that it gives back."""

    def round_trips(word):
        ids = tokenizer(word, add_special_tokens=False)["input_ids"]
        return word in tokenizer.convert_tokens_to_string(tokenizer.convert_ids_to_tokens(ids))

    if round_trips(default):
        return default
    vocab = tokenizer.get_vocab()
    for word in sorted(vocab, key=vocab.get):
        if word.isalpha() and round_trips(word):
            return word
    raise ValueError(
        f"stop strings: the tokenizer gives back neither {default!r} nor any alphabetic word of its vocabulary "
        "after encoding and decoding it, so the text of its tokens cannot be learned."
    )


class WordLevelStopStringCriteria(StopStringCriteria):
    """`StopStringCriteria` whose vocabulary cleaning probes with a word the tokenizer knows (see `probe_word`)."""

    @staticmethod
    def clean_tokenizer_vocab(tokenizer, static_prefix="abcdef", stop_string_matching_mode=None):
        return StopStringCriteria.clean_tokenizer_vocab(
            tokenizer, probe_word(tokenizer, static_prefix), stop_string_matching_mode
        )


__all__ = [
    "TransfoXLPreTrainedModel",
    "TransfoXLModel",
    "TransfoXLLMHeadModel",
    "TransfoXLForSequenceClassification",
]
