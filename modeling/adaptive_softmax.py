"""Adaptive input embeddings, the projected adaptive log-softmax, and the log-uniform sampled softmax.

The vocabulary is split by `cutoffs` into a head cluster (frequent ids) and tail clusters. Cluster i embeds its ids
in `d_embed // div_val**i` dimensions and projects them to the model width (Baevski & Auli 2019, adaptive input);
the output distribution factorises as p(w) = p(cluster | h) p(w | cluster, h) (Grave et al. 2017, adaptive
softmax): the head softmax scores the head ids plus one logit per tail cluster.

Parameter names (`emb_layers`, `emb_projs`, `out_layers`, `out_projs`, `cluster_weight`, `cluster_bias`) are those
of the legacy checkpoints. Projections are stored [d_proj, d_emb] and applied as `x @ proj` (output side) or
`F.linear(x, proj)` (input side).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .cross_entropy import Softmax, SoftmaxPart, linear_cross_entropy, linear_into, softmax_dtype
from .decoding_linear import MAX_ROWS, is_differentiable, is_plain_linear, linear
from .library_ops import define


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

    def resize(self, vocab_size: int, resize_table):
        """Make the last cluster end at `vocab_size`: `resize_table(table, rows)` gives the last table (the whole
        vocabulary's with div_val 1) with `rows` rows, its old rows first."""
        first_id = self.bounds[-1][0] if self.div_val > 1 else 0
        self.emb_layers[-1] = resize_table(self.emb_layers[-1], vocab_size - first_id)
        self.vocab_size, self.bounds = vocab_size, resized_bounds(self.bounds, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.div_val == 1:
            embeddings = self.emb_layers[0](input_ids)
            if len(self.emb_projs):
                embeddings = F.linear(embeddings, self.emb_projs[0])
        else:
            flat_ids = input_ids.reshape(-1)
            # Allocated in the compute dtype: a fp32 buffer would reject fp16/bf16 rows (HF #19914).
            dtype = self.emb_projs[0].dtype
            flat = torch.zeros(flat_ids.shape[0], self.d_proj, dtype=dtype, device=flat_ids.device)
            for (start, end), table, proj in zip(self.bounds, self.emb_layers, self.emb_projs):
                rows = ((flat_ids >= start) & (flat_ids < end)).nonzero().squeeze(-1)
                cluster_embeddings = F.linear(table(flat_ids[rows] - start), proj)
                flat.index_copy_(0, rows, cluster_embeddings.to(dtype))
            embeddings = flat.view(*input_ids.shape, self.d_proj)
        return embeddings * self.emb_scale


class ProjectedAdaptiveLogSoftmax(nn.Module):
    """Hidden states -> log-probabilities over the vocabulary (or the NLL of given targets).

    The head cluster's softmax covers `cutoffs[0]` ids plus one logit per tail cluster; the log-probability of an
    id in tail cluster i is log p(cluster i) (head column `cutoffs[0] + i - 1`) + log p(id | cluster i). The legacy
    `log_prob()` read column `-i` (reversed order) and mis-sliced; this module has one code path for both.
    """

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
            self.out_layers.append(nn.Linear(d_embed, vocab_size))
            for _ in self.bounds:
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, d_embed)) if d_proj != d_embed else None)
        else:
            for (start, end), dim in zip(self.bounds, cluster_dims(d_embed, div_val, len(self.bounds))):
                self.out_layers.append(nn.Linear(dim, end - start))
                self.out_projs.append(nn.Parameter(torch.empty(d_proj, dim)))

    def resize(self, vocab_size: int, resize_layer):
        """Make the last cluster end at `vocab_size`: `resize_layer(layer, rows)` gives the last output layer (the
        whole vocabulary's with div_val 1) with `rows` output rows, its old rows first. The head softmax, which
        scores the head ids and one logit per tail cluster, is unchanged (unless the head is the only cluster)."""
        first_id = self.bounds[-1][0] if self.div_val > 1 else 0
        self.out_layers[-1] = resize_layer(self.out_layers[-1], vocab_size - first_id)
        self.vocab_size, self.bounds = vocab_size, resized_bounds(self.bounds, vocab_size)
        self.head_size = self.bounds[0][1] + len(self.bounds) - 1

    def _clusters(self):
        """(weight, bias, projection or None) of every cluster, head first. With div_val 1 the one output layer is
        split (not sliced per cluster: the gradient of a split is one concatenation, that of each slice a
        zero-filled full-vocabulary tensor)."""
        if self.div_val == 1:
            sizes = [end - start for start, end in self.bounds]
            weights, biases = self.out_layers[0].weight.split(sizes), self.out_layers[0].bias.split(sizes)
        else:
            weights, biases = [layer.weight for layer in self.out_layers], [layer.bias for layer in self.out_layers]
        return list(zip(weights, biases, self.out_projs))

    @staticmethod
    def _logits(hidden, weight, bias, proj, out=None):
        """Logits [N, rows of weight] of `hidden` (projected first by `proj` unless None), fp32 or wider; with `out`
        (a column slice of the output, outside torch.compile) written there, by the GEMM itself where it can (more
        rows than a decoding step's)."""
        hidden = _project(hidden, proj)
        if out is not None and hidden.shape[0] > MAX_ROWS and not torch.is_autocast_enabled(hidden.device.type):
            return linear_into(out, hidden, weight, bias)
        logits = linear(hidden, weight, bias).to(softmax_dtype(hidden.dtype))
        return logits if out is None else out.copy_(logits)

    def _called_logits(self, hidden):
        """Every cluster's logits (the head's followed by its cluster logits), fp32 or wider, from output layers that
        are called rather than read (quantized or replaced layers): each distinct (layer, projection) is called once
        and its output split by cluster."""
        outputs, logits = {}, []
        for cluster, (start, end) in enumerate(self.bounds):
            layer, proj = self.out_layers[0 if self.div_val == 1 else cluster], self.out_projs[cluster]
            if (id(layer), id(proj)) not in outputs:
                outputs[id(layer), id(proj)] = layer(_project(hidden, proj)).to(softmax_dtype(hidden.dtype))
            first = start if self.div_val == 1 else 0
            logits.append(outputs[id(layer), id(proj)][:, first : first + end - start])
        if len(self.bounds) > 1:
            cluster_logits = F.linear(_project(hidden, self.out_projs[0]), self.cluster_weight, self.cluster_bias)
            logits[0] = torch.cat([logits[0], cluster_logits.to(logits[0].dtype)], -1)
        return logits

    def _plain_layers(self) -> bool:
        """Whether the output layers are plain `nn.Linear` layers, whose weights the fast paths read."""
        return all(is_plain_linear(layer) for layer in self.out_layers)

    def _head_cluster(self, clusters):
        """The head softmax's (weight, bias, projection), from `_clusters()`: the head words' rows, then one per tail
        cluster (the cluster weights joined to the head's: a [head size, d] copy, not an [N, head size] one)."""
        weight, bias, proj = clusters[0]
        if len(self.bounds) > 1:
            weight, bias = torch.cat([weight, self.cluster_weight]), torch.cat([bias, self.cluster_bias])
        return weight, bias, proj

    def log_prob(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d_proj] -> [N, vocab_size] log-probabilities (computed in fp32, or fp64).

        log p(w) = log_softmax(head logits) for a head word; log p(cluster | h) + log_softmax(cluster logits) for a
        tail word. Without gradients written into the output's columns (`_log_prob_into_columns`: autograd cannot
        follow writes into `out=`); with gradients, with output layers that are called rather than read (quantized),
        or under torch.export, log_softmax per cluster and one concatenation."""
        head_end, plain = self.bounds[0][1], self._plain_layers()
        # (torch.export, and ONNX export through it, trace this path too: plain operations, no operator of ours)
        if not plain or is_differentiable(hidden, self.out_layers[0].weight) or torch.compiler.is_exporting():
            if plain:
                clusters = self._clusters()
                logits = [self._logits(hidden, *self._head_cluster(clusters))]
                logits += [self._logits(hidden, *cluster) for cluster in clusters[1:]]
            else:
                logits = self._called_logits(hidden)
            head = torch.log_softmax(logits[0], -1)
            pieces = [head[:, :head_end]]
            for cluster, tail_logits in enumerate(logits[1:], start=1):
                pieces.append(torch.log_softmax(tail_logits, -1) + head[:, head_end + cluster - 1, None])
            return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]
        clusters = self._clusters()
        weights, biases, projections = (list(field) for field in zip(*clusters))
        has_tails = len(self.bounds) > 1
        tail_clusters = (self.cluster_weight, self.cluster_bias) if has_tails else (None, None)
        # (Under torch.compile one operator, which runs these passes: traced, they would be the graph's own
        # log-softmax kernels over [N, vocabulary] columns, slower than the matrix products.)
        write = log_prob_op if torch.compiler.is_compiling() else _log_prob_into_columns
        return write(hidden, weights, biases, projections, *tail_clusters)

    def nll(self, hidden: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """[N, d_proj], [N] -> [N] negative log-likelihood of each target, in input order (fp32 or wider).

        -log p(w) = -log p(cluster | h) - log p(w | cluster, h): a cross-entropy over the head softmax (whose target is
        the word itself or its cluster's column) plus, for a tail word, one over its cluster, scored only for the rows
        whose target falls in it (`linear_cross_entropy`: never an [N, vocabulary] tensor, with or without
        gradients). Output layers that are called rather than read (quantized) give the log-probabilities' entries."""
        if not self._plain_layers():
            return -self.log_prob(hidden).gather(1, target[:, None]).squeeze(1)
        head_end = self.bounds[0][1]
        cluster_of = torch.bucketize(target, torch.tensor([end for _, end in self.bounds[:-1]], device=target.device),
                                     right=True)  # fmt: skip
        head_parts = self._softmax_parts(0)
        if len(self.bounds) > 1:
            head_parts += (SoftmaxPart(self.cluster_weight, self.cluster_bias, 0, len(self.bounds) - 1),)
        head_target = target.where(cluster_of == 0, head_end - 1 + cluster_of)
        softmaxes = [Softmax(_project(hidden, self.out_projs[0]), head_target, head_parts)]
        for cluster in range(1, len(self.bounds)):
            rows = (cluster_of == cluster).nonzero().squeeze(-1)
            tail_target = target[rows] - self.bounds[cluster][0]
            tail_hidden = _project(hidden[rows], self.out_projs[cluster])
            softmaxes.append(Softmax(tail_hidden, tail_target, self._softmax_parts(cluster), rows))
        return linear_cross_entropy(softmaxes, hidden.shape[0])

    def _softmax_parts(self, cluster: int) -> tuple[SoftmaxPart, ...]:
        """Cluster `cluster`'s words as rows of its output layer (with div_val 1, a row range of the one layer)."""
        start, end = self.bounds[cluster]
        if self.div_val == 1:
            layer = self.out_layers[0]
            return (SoftmaxPart(layer.weight, layer.bias, start, end),)
        layer = self.out_layers[cluster]
        return (SoftmaxPart(layer.weight, layer.bias, 0, end - start),)


def _log_prob_into_columns(
    hidden: torch.Tensor,
    weights: list[torch.Tensor],
    biases: list[torch.Tensor],
    projections: list[Optional[torch.Tensor]],
    cluster_weight: Optional[torch.Tensor],
    cluster_bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """`ProjectedAdaptiveLogSoftmax.log_prob` without gradients, from its clusters' (weight, bias, projection),
    head first, and the tail clusters' logits in the head softmax (None without tails).

    Each cluster's logits are written straight into their columns of the output and normalised there in place, so
    no cluster-sized temporary or concatenation is made. The head softmax (head words, then one logit per tail
    cluster) is normalised in the output's first columns; the tail clusters' log-probabilities are kept aside before
    the first tail cluster overwrites them. (The biases are added by `_log_softmax_`'s pass, not by the GEMM, whose
    out= form would first copy them into the whole output slice.) (The cluster logits are a product of their own
    beside the head words': joining the cluster weights to the head's, as with gradients, would copy the head's
    weights at every decoding step.)"""
    sizes = [weight.shape[0] for weight in weights]
    head_end, vocab_size = sizes[0], sum(sizes)
    head_size = head_end + len(sizes) - 1  # (the head words, then one logit per tail cluster)
    output = torch.empty(hidden.shape[0], vocab_size, dtype=softmax_dtype(hidden.dtype), device=hidden.device)
    projected = _project(hidden, projections[0])
    ProjectedAdaptiveLogSoftmax._logits(projected, weights[0], None, None, out=output[:, :head_end])
    bias = biases[0]
    if cluster_weight is not None:
        ProjectedAdaptiveLogSoftmax._logits(projected, cluster_weight, None, None, out=output[:, head_end:head_size])
        bias = torch.cat([bias, cluster_bias])
    head = _log_softmax_(output[:, :head_size], bias)
    cluster_log_p = head[:, head_end:].clone()
    start = head_end
    for cluster in range(1, len(sizes)):
        end = start + sizes[cluster]
        logits = ProjectedAdaptiveLogSoftmax._logits(hidden, weights[cluster], None, projections[cluster],
                                                     out=output[:, start:end])  # fmt: skip
        _log_softmax_(logits, biases[cluster], cluster_log_p[:, cluster - 1, None])
        start = end
    return output


def _log_prob_fake(hidden, weights, biases, projections, cluster_weight, cluster_bias):
    vocab_size = sum(weight.shape[0] for weight in weights)
    return hidden.new_empty(hidden.shape[0], vocab_size, dtype=softmax_dtype(hidden.dtype))


log_prob_op = define(__package__ or __name__, "adaptive_log_prob", _log_prob_into_columns, _log_prob_fake)


def _project(hidden: torch.Tensor, proj: torch.Tensor | None) -> torch.Tensor:
    """A cluster's input: the hidden states through its output projection (stored [d_proj, d_emb]), if any."""
    return hidden if proj is None else hidden @ proj


# Rows per chunk of `_log_softmax_`'s buffer: 4 MiB in fp32 (cache-sized), reused by every chunk.
LOG_SOFTMAX_CHUNK_ELEMENTS = 1 << 20


def _log_softmax_(logits: torch.Tensor, bias: torch.Tensor | None = None, shift: torch.Tensor | None = None):
    """log_softmax(logits + bias) + shift over the last dimension (bias [C] and shift [N, 1] optional), in place in
    `logits`, a column slice of the output. torch's kernel copies a non-contiguous input and output whole; here
    chunks of rows go through one small contiguous buffer, adding the bias on the way in and the shift on the way
    back (2.0x faster for a 20000-word cluster)."""
    rows = max(1, LOG_SOFTMAX_CHUNK_ELEMENTS // logits.shape[-1])
    buffer = logits.new_empty(min(rows, logits.shape[0]), logits.shape[-1])
    for first in range(0, logits.shape[0], rows):
        block = logits[first : first + rows]
        chunk = buffer[: block.shape[0]]
        if bias is None:
            chunk.copy_(block)
        else:
            torch.add(block, bias, out=chunk)
        torch.log_softmax(chunk, -1, out=chunk)
        if shift is None:
            block.copy_(chunk)
        else:
            torch.add(chunk, shift[first : first + rows], out=block)
    return logits


class LogUniformSampler:
    """Draws negative ids from the log-uniform (Zipfian) distribution P(k) = log((k+2)/(k+1)) / log(V+1).

    The original code's sampler for `sample_softmax > 0`: ids are assumed sorted by frequency. `log_q` is the log of
    the probability that an id appears at least once among 2 * n_sample draws (Jean et al. 2015 correction).
    """

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
    """NLL of `labels` [N] under a softmax over the label and shared log-uniform negatives (training only).

    Scores use the tied input embedding (`embedding(ids)`, scaled as in the model input) and a per-id output bias;
    each score is corrected by -log q (sampled softmax, Jean et al. 2015), negatives equal to the label are removed.
    """
    true_log_q, sample_log_q, negatives = sampler.sample(labels)
    true_w, sample_w = embedding(labels), embedding(negatives)
    true_logit = (true_w * hidden).sum(-1) + bias[labels] - true_log_q
    sample_logit = hidden @ sample_w.t() + bias[negatives] - sample_log_q
    sample_logit = sample_logit.masked_fill(labels[:, None] == negatives, torch.finfo(sample_logit.dtype).min)
    logits = torch.cat([true_logit[:, None], sample_logit], dim=-1)
    return -torch.log_softmax(logits.float(), dim=-1)[:, 0]
