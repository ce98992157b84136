"""The original TF forward graphs, re-written small, to check converted checkpoints against (TensorFlow >= 2 via
tf.compat.v1; imported lazily: nothing here runs without TensorFlow).

These follow the semantics of the original code, read op by op: Transformer-XL from kimiyoung/transformer-xl
`tf/model.py` (`transformer` with `mask_adaptive_embedding_lookup` / `mask_adaptive_logsoftmax`, as `train_gpu.py`
builds it) and XLNet from zihangdai/xlnet `modeling.py` (`transformer_xl` without the query stream) with the heads
of `function_builder.py` / `modeling.py` (sequence summary, classification, regression, RACE, SQuAD at inference).
Variables are created with the same scopes as the originals, so a graph built here restores a checkpoint written by
the original code (and the fixture script writes its checkpoints from these graphs). `tf.layers` and
`tf.contrib.layers.layer_norm` are gone from TensorFlow 2, so `_dense` and `_layer_norm` re-create them: the same
variable names (`kernel`, `bias`, `LayerNorm/{beta,gamma}`) and the same math (layer norm epsilon 1e-12).

Everything is time-major, as in the originals: ids [len, batch], memories [mem_len, batch, d_model].
"""

import numpy as np


def _tf():
    import tensorflow as tf

    return tf.compat.v1


# ----- building blocks ---------------------------------------------------------------------------------------------


def _dense(x, units, name, activation=None, use_bias=True):
    tf = _tf()
    with tf.variable_scope(name):
        kernel = tf.get_variable("kernel", [x.shape[-1], units])
        y = tf.tensordot(x, kernel, 1)
        if use_bias:
            y = y + tf.get_variable("bias", [units], initializer=tf.zeros_initializer())
    return activation(y) if activation is not None else y


def _layer_norm(x, scope="LayerNorm"):
    """tf.contrib.layers.layer_norm(x, begin_norm_axis=-1): normalise the last axis, epsilon 1e-12."""
    tf = _tf()
    with tf.variable_scope(scope):
        beta = tf.get_variable("beta", [x.shape[-1]], initializer=tf.zeros_initializer())
        gamma = tf.get_variable("gamma", [x.shape[-1]], initializer=tf.ones_initializer())
        mean, variance = tf.nn.moments(x, [-1], keepdims=True)
        return tf.nn.batch_normalization(x, mean, variance, beta, gamma, 1e-12)


def _positional_embedding(pos_seq, d_model):
    tf = _tf()
    inv_freq = 1 / (10000 ** (tf.range(0, d_model, 2.0) / d_model))
    sinusoid = tf.einsum("i,d->id", pos_seq, inv_freq)
    return tf.concat([tf.sin(sinusoid), tf.cos(sinusoid)], -1)[:, None, :]


def _gelu(x):
    """The original's gelu: the tanh approximation."""
    tf = _tf()
    return x * 0.5 * (1.0 + tf.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * tf.pow(x, 3))))


def _cache_mem(output, prev_mem, mem_len):
    tf = _tf()
    new_mem = output if prev_mem is None else tf.concat([prev_mem, output], 0)
    return tf.stop_gradient(new_mem[-mem_len:])


# ----- Transformer-XL (kimiyoung tf/model.py) ----------------------------------------------------------------------


def _txl_rel_shift(x):
    tf = _tf()
    size = tf.shape(x)
    x = tf.pad(x, [[0, 0], [1, 0], [0, 0], [0, 0]])
    x = tf.reshape(x, [size[1] + 1, size[0], size[2], size[3]])
    return tf.reshape(x[1:], size)


def _txl_mask(qlen, mlen, same_length):
    tf = _tf()
    ones = tf.ones([qlen, qlen])
    upper = tf.linalg.band_part(ones, 0, -1)
    diagonal = tf.linalg.band_part(ones, 0, 0)
    mask = tf.concat([tf.zeros([qlen, mlen]), upper - diagonal], 1)
    if same_length:
        lower = tf.linalg.band_part(ones, -1, 0)
        mask = tf.concat([mask[:, :qlen] + lower - diagonal, mask[:, qlen:]], 1)
    return mask


def _txl_attention(w, r, r_w_bias, r_r_bias, mask, mems, spec):
    tf = _tf()
    n_head, d_head = spec["n_head"], spec["d_head"]
    with tf.variable_scope("rel_attn"):
        qlen, rlen, bsz = tf.shape(w)[0], tf.shape(r)[0], tf.shape(w)[1]
        cat = tf.concat([mems, w], 0)
        heads = _dense(cat, 3 * n_head * d_head, "qkv", use_bias=False)
        r_head_k = _dense(r, n_head * d_head, "r", use_bias=False)
        q, k, v = tf.split(heads, 3, -1)
        q = tf.reshape(q[-qlen:], [qlen, bsz, n_head, d_head])
        klen = tf.shape(k)[0]
        k = tf.reshape(k, [klen, bsz, n_head, d_head])
        v = tf.reshape(v, [klen, bsz, n_head, d_head])
        r_head_k = tf.reshape(r_head_k, [rlen, n_head, d_head])
        ac = tf.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
        bd = _txl_rel_shift(tf.einsum("ibnd,jnd->ijbn", q + r_r_bias, r_head_k))
        score = (ac + bd) / d_head**0.5
        mask = mask[:, :, None, None]
        score = score * (1 - mask) - 1e30 * mask
        prob = tf.nn.softmax(score, 1)
        vec = tf.einsum("ijbn,jbnd->ibnd", prob, v)
        vec = tf.reshape(vec, [qlen, bsz, n_head * d_head])
        return _layer_norm(_dense(vec, spec["d_model"], "o", use_bias=False) + w)


def _txl_feed_forward(x, spec):
    tf = _tf()
    with tf.variable_scope("ff"):
        hidden = _dense(x, spec["d_inner"], "layer_1", activation=tf.nn.relu)
        return _layer_norm(_dense(hidden, spec["d_model"], "layer_2") + x)


def _txl_embedding(ids, spec):
    """mask_adaptive_embedding_lookup: (embeddings [len, batch, d_model], tables, projections)."""
    tf = _tf()
    d_model, d_embed, div_val, cutoffs = spec["d_model"], spec["d_embed"], spec["div_val"], spec["cutoffs"]
    with tf.variable_scope("adaptive_embed"):
        if div_val == 1:
            table = tf.get_variable("lookup_table", [spec["n_token"], d_embed])
            y = tf.nn.embedding_lookup(table, ids)
            proj = None
            if d_model != d_embed:
                proj = tf.get_variable("proj_W", [d_embed, d_model])
                y = tf.einsum("ibe,ed->ibd", y, proj)
            tables, projs = table, proj
        else:
            tables, projs = [], []
            ends = [0] + cutoffs + [spec["n_token"]]
            y = tf.zeros([tf.shape(ids)[0], tf.shape(ids)[1], d_model])
            for i in range(len(ends) - 1):
                with tf.variable_scope(f"cutoff_{i}"):
                    lo, hi = ends[i], ends[i + 1]
                    mask = (ids >= lo) & (ids < hi)
                    cur_d = d_embed // div_val**i
                    table = tf.get_variable("lookup_table", [hi - lo, cur_d])
                    cur_y = tf.nn.embedding_lookup(table, tf.boolean_mask(ids, mask) - lo)
                    proj = None
                    if cur_d != d_model or spec["proj_same_dim"]:
                        proj = tf.get_variable("proj_W", [cur_d, d_model])
                        cur_y = tf.einsum("id,de->ie", cur_y, proj)
                    y += tf.scatter_nd(tf.cast(tf.where(mask), tf.int64), cur_y, tf.cast(tf.shape(y), tf.int64))
                    tables.append(table)
                    projs.append(proj)
    return y * d_model**0.5, tables, projs


def _txl_log_probs(hidden, tables, projs, spec):
    """The adaptive softmax of mask_adaptive_logsoftmax, as log-probabilities of every token [len, batch, n_token]:
    head clusters' column `cutoff_ends[1] + i - 1` plus the tail's own log-softmax."""
    tf = _tf()
    d_model, d_embed, div_val, cutoffs = spec["d_model"], spec["d_embed"], spec["div_val"], spec["cutoffs"]

    def logit(x, weight, bias, proj):
        if proj is not None:
            x = tf.einsum("ibd,ed->ibe", x, proj)
        return tf.einsum("ibd,nd->ibn", x, weight) + bias

    with tf.variable_scope("adaptive_softmax"):
        if not cutoffs:
            bias = tf.get_variable("bias", [spec["n_token"]], initializer=tf.zeros_initializer())
            return tf.nn.log_softmax(logit(hidden, tables, bias, projs))
        ends = [0] + cutoffs + [spec["n_token"]]
        pieces = []
        for i in range(len(ends) - 1):
            with tf.variable_scope(f"cutoff_{i}"):
                lo, hi = ends[i], ends[i + 1]
                cur_d = d_embed // div_val**i
                weight = tables[lo:hi] if div_val == 1 else tables[i]
                bias = tf.get_variable("b", [hi - lo], initializer=tf.zeros_initializer())
                if spec["tie_projs"][i]:
                    proj = projs if div_val == 1 else projs[i]
                elif (div_val == 1 or not spec["proj_same_dim"]) and d_model == cur_d:
                    proj = None
                else:
                    proj = tf.get_variable("proj", [cur_d, d_model])
                if i == 0:
                    cluster_w = tf.get_variable("cluster_W", [len(cutoffs), d_embed])
                    cluster_b = tf.get_variable("cluster_b", [len(cutoffs)], initializer=tf.zeros_initializer())
                    head = tf.nn.log_softmax(
                        logit(hidden, tf.concat([weight, cluster_w], 0), tf.concat([bias, cluster_b], 0), proj)
                    )
                    pieces.append(head[:, :, : ends[1]])
                else:
                    tail = tf.nn.log_softmax(logit(hidden, weight, bias, proj))
                    pieces.append(head[:, :, ends[1] + i - 1 : ends[1] + i] + tail)
        return tf.concat(pieces, -1)


def transformer_xl_lm(ids, mems, spec):
    """kimiyoung `transformer` at evaluation (no dropout): (log-probabilities [len, batch, n_token], new memories).

    `spec`: the original hyper-parameters (n_token, n_layer, d_model, d_embed, n_head, d_head, d_inner, cutoffs,
    div_val, tie_projs, proj_same_dim, untie_r, same_length, clamp_len, mem_len). `mems`: n_layer tensors
    [mlen, batch, d_model] (train_gpu.py feeds mem_len zero vectors at the start)."""
    tf = _tf()
    n_layer, n_head, d_head = spec["n_layer"], spec["n_head"], spec["d_head"]
    with tf.variable_scope("transformer"):
        bias_shape = [n_layer, n_head, d_head] if spec["untie_r"] else [n_head, d_head]
        r_w_bias = tf.get_variable("r_w_bias", bias_shape)
        r_r_bias = tf.get_variable("r_r_bias", bias_shape)
        qlen, mlen = tf.shape(ids)[0], tf.shape(mems[0])[0]
        embeddings, tables, projs = _txl_embedding(ids, spec)
        mask = _txl_mask(qlen, mlen, spec["same_length"])
        pos_seq = tf.range(tf.cast(mlen + qlen, tf.float32) - 1, -1, -1.0)
        if spec["clamp_len"] > 0:
            pos_seq = tf.minimum(pos_seq, float(spec["clamp_len"]))
        pos_emb = _positional_embedding(pos_seq, spec["d_model"])
        output, new_mems = embeddings, []
        for i in range(n_layer):
            new_mems.append(_cache_mem(output, mems[i], spec["mem_len"]))
            with tf.variable_scope(f"layer_{i}"):
                w_bias = r_w_bias[i] if spec["untie_r"] else r_w_bias
                r_bias = r_r_bias[i] if spec["untie_r"] else r_r_bias
                output = _txl_attention(output, pos_emb, w_bias, r_bias, mask, mems[i], spec)
                output = _txl_feed_forward(output, spec)
        return _txl_log_probs(output, tables, projs, spec), new_mems


# ----- XLNet (zihangdai modeling.py, function_builder.py) ----------------------------------------------------------


def _xlnet_head_projection(h, spec, name):
    tf = _tf()
    kernel = tf.get_variable(f"{name}/kernel", [spec["d_model"], spec["n_head"], spec["d_head"]])
    return tf.einsum("ibh,hnd->ibnd", h, kernel)


def _xlnet_rel_shift(x, klen):
    tf = _tf()
    size = tf.shape(x)
    x = tf.reshape(x, [size[1], size[0], size[2], size[3]])[1:]
    x = tf.reshape(x, [size[0], size[1] - 1, size[2], size[3]])
    return x[:, :klen]


def _xlnet_attention(h, r, mems, biases, seg_embed, seg_mat, mask, spec):
    tf = _tf()
    r_w_bias, r_r_bias, r_s_bias = biases
    with tf.variable_scope("rel_attn"):
        cat = tf.concat([mems, h], 0) if mems is not None else h
        q = _xlnet_head_projection(h, spec, "q")
        k = _xlnet_head_projection(cat, spec, "k")
        v = _xlnet_head_projection(cat, spec, "v")
        k_r = _xlnet_head_projection(r, spec, "r")
        ac = tf.einsum("ibnd,jbnd->ijbn", q + r_w_bias, k)
        bd = _xlnet_rel_shift(tf.einsum("ibnd,jbnd->ijbn", q + r_r_bias, k_r), tf.shape(ac)[1])
        ef = 0
        if seg_mat is not None:
            ef = tf.einsum("ibnd,snd->ibns", q + r_s_bias, seg_embed)
            ef = tf.einsum("ijbs,ibns->ijbn", seg_mat, ef)
        score = (ac + bd + ef) / spec["d_head"] ** 0.5
        if mask is not None:
            score = score - 1e30 * mask
        vec = tf.einsum("ijbn,jbnd->ibnd", tf.nn.softmax(score, 1), v)
        proj_o = tf.get_variable("o/kernel", [spec["d_model"], spec["n_head"], spec["d_head"]])
        return _layer_norm(tf.einsum("ibnd,hnd->ibh", vec, proj_o) + h)


def xlnet_encoder(ids, seg_ids, input_mask, mems, spec, mask_emb=False):
    """zihangdai `transformer_xl` for fine-tuning / evaluation (attn_type "bi", no bi_data, no query stream) under
    scope `model/`: (output [len, batch, d_model], new memories, word embedding table).

    `seg_ids` [len, batch] or None; `input_mask` [len, batch] float, 1 = padding, or None; `mems`: n_layer tensors
    [mlen, batch, d_model] or None. `mask_emb=True` also creates `mask_emb` (pretraining checkpoints hold it)."""
    tf = _tf()
    n_layer, n_head, d_head, d_model = spec["n_layer"], spec["n_head"], spec["d_head"], spec["d_model"]
    with tf.variable_scope("model", reuse=tf.AUTO_REUSE), tf.variable_scope("transformer"):
        bias_shape = [n_layer, n_head, d_head] if spec["untie_r"] else [n_head, d_head]
        r_w_bias = tf.get_variable("r_w_bias", bias_shape)
        r_r_bias = tf.get_variable("r_r_bias", bias_shape)
        bsz, qlen = tf.shape(ids)[1], tf.shape(ids)[0]
        mlen = tf.shape(mems[0])[0] if mems is not None else 0
        klen = mlen + qlen

        mask = None
        if input_mask is not None:
            data_mask = tf.concat([tf.zeros([1, mlen, bsz]), input_mask[None]], 1)
            attn_mask = tf.cast(data_mask[:, :, :, None] > 0, tf.float32)
            not_self = tf.concat([tf.zeros([qlen, mlen]), -tf.eye(qlen)], -1)
            mask = tf.cast(attn_mask + not_self[:, :, None, None] > 0, tf.float32)

        with tf.variable_scope("word_embedding"):
            table = tf.get_variable("lookup_table", [spec["n_token"], d_model])
        output = tf.nn.embedding_lookup(table, ids)
        if mask_emb:
            with tf.variable_scope("mask_emb"):
                tf.get_variable("mask_emb", [1, 1, d_model])

        seg_mat = r_s_bias = seg_embed = None
        if seg_ids is not None:
            r_s_bias = tf.get_variable("r_s_bias", bias_shape)
            seg_embed = tf.get_variable("seg_embed", [n_layer, 2, n_head, d_head])
            cat_ids = tf.concat([tf.zeros([mlen, bsz], dtype=seg_ids.dtype), seg_ids], 0)
            different = tf.cast(tf.logical_not(tf.equal(seg_ids[:, None], cat_ids[None, :])), tf.int32)
            seg_mat = tf.one_hot(different, 2, dtype=tf.float32)

        pos_seq = tf.range(tf.cast(klen, tf.float32), tf.cast(-qlen, tf.float32), -1.0)
        if spec["clamp_len"] > 0:
            pos_seq = tf.clip_by_value(pos_seq, -float(spec["clamp_len"]), float(spec["clamp_len"]))
        pos_emb = tf.tile(_positional_embedding(pos_seq, d_model), [1, bsz, 1])

        activation = _gelu if spec["ff_activation"] == "gelu" else tf.nn.relu
        new_mems = []
        for i in range(n_layer):
            new_mems.append(_cache_mem(output, None if mems is None else mems[i], spec["mem_len"]))
            untie = spec["untie_r"]
            biases = (
                r_w_bias[i] if untie else r_w_bias,
                r_r_bias[i] if untie else r_r_bias,
                None if r_s_bias is None else (r_s_bias[i] if untie else r_s_bias),
            )
            with tf.variable_scope(f"layer_{i}"):
                output = _xlnet_attention(
                    output, pos_emb, None if mems is None else mems[i], biases,
                    None if seg_embed is None else seg_embed[i], seg_mat, mask, spec,
                )
                with tf.variable_scope("ff"):
                    hidden = _dense(output, spec["d_inner"], "layer_1", activation=activation)
                    output = _layer_norm(_dense(hidden, d_model, "layer_2") + output)
        return output, new_mems, table


def xlnet_lm_logits(output, table):
    """modeling.lm_loss's logits with the tied table (scope model/lm_loss): [len, batch, n_token]."""
    tf = _tf()
    with tf.variable_scope("model", reuse=tf.AUTO_REUSE), tf.variable_scope("lm_loss"):
        bias = tf.get_variable("bias", [table.shape[0]], initializer=tf.zeros_initializer())
        return tf.einsum("ibd,nd->ibn", output, table) + bias


def xlnet_summary(output, use_proj=True):
    """summarize_sequence with summary_type "last" (scope model/sequnece_summary, sic): [batch, d_model]."""
    tf = _tf()
    with tf.variable_scope("model", reuse=tf.AUTO_REUSE), tf.variable_scope("sequnece_summary"):
        summary = output[-1]
        if use_proj:
            summary = _dense(summary, output.shape[-1], "summary", activation=tf.tanh)
        return summary


def xlnet_classification_logits(summary, n_class, task):
    """classification_loss's logits (scope model/classification_<task>/logit): [batch, n_class]."""
    tf = _tf()
    with tf.variable_scope("model", reuse=tf.AUTO_REUSE), tf.variable_scope(f"classification_{task}"):
        return _dense(summary, n_class, "logit")


def xlnet_regression_logits(summary, task):
    """regression_loss's logits (scope model/regression_<task>/logit): [batch]."""
    tf = _tf()
    with tf.variable_scope("model", reuse=tf.AUTO_REUSE), tf.variable_scope(f"regression_{task}"):
        return tf.squeeze(_dense(summary, 1, "logit"), -1)


def xlnet_race_logits(summary, num_choices):
    """get_race_loss's logits (scope logits/dense): the summaries of [batch * choices] sequences -> [batch, choices]."""
    tf = _tf()
    with tf.variable_scope("logits"):
        return tf.reshape(_dense(summary, 1, "dense"), [-1, num_choices])


def xlnet_squad_outputs(output, p_mask, cls_index, start_n_top, end_n_top):
    """get_qa_outputs at inference (is_training False): start_top_log_probs / _index [batch, k_s], end_top_log_probs
    / _index [batch, k_s * k_e], cls_logits [batch]. `p_mask` [batch, len] float (1 = impossible position)."""
    tf = _tf()
    seq_len, d_model = tf.shape(output)[0], output.shape[-1]
    with tf.variable_scope("start_logits"):
        start_logits = tf.transpose(tf.squeeze(_dense(output, 1, "dense"), -1), [1, 0])
        start_logits_masked = start_logits * (1 - p_mask) - 1e30 * p_mask
        start_log_probs = tf.nn.log_softmax(start_logits_masked, -1)
    with tf.variable_scope("end_logits"):
        start_top_log_probs, start_top_index = tf.nn.top_k(start_log_probs, k=start_n_top)
        start_index = tf.one_hot(start_top_index, depth=seq_len, axis=-1, dtype=tf.float32)
        start_features = tf.einsum("lbh,bkl->bkh", output, start_index)
        end_input = tf.tile(output[:, :, None], [1, 1, start_n_top, 1])
        start_features = tf.tile(start_features[None], [seq_len, 1, 1, 1])
        end_input = tf.concat([end_input, start_features], axis=-1)
        end_logits = _dense(end_input, d_model, "dense_0", activation=tf.tanh)
        end_logits = _dense(_layer_norm(end_logits), 1, "dense_1")
        end_logits = tf.transpose(tf.reshape(end_logits, [seq_len, -1, start_n_top]), [1, 2, 0])
        end_logits_masked = end_logits * (1 - p_mask[:, None]) - 1e30 * p_mask[:, None]
        end_log_probs = tf.nn.log_softmax(end_logits_masked, -1)
        end_top_log_probs, end_top_index = tf.nn.top_k(end_log_probs, k=end_n_top)
        end_top_log_probs = tf.reshape(end_top_log_probs, [-1, start_n_top * end_n_top])
        end_top_index = tf.reshape(end_top_index, [-1, start_n_top * end_n_top])
    with tf.variable_scope("answer_class"):
        cls_feature = tf.einsum("lbh,bl->bh", output, tf.one_hot(cls_index, seq_len, axis=-1, dtype=tf.float32))
        start_feature = tf.einsum("lbh,bl->bh", output, tf.nn.softmax(start_logits_masked, axis=-1))
        ans_feature = _dense(tf.concat([start_feature, cls_feature], -1), d_model, "dense_0", activation=tf.tanh)
        cls_logits = tf.squeeze(_dense(ans_feature, 1, "dense_1", use_bias=False), -1)
    return {
        "start_top_log_probs": start_top_log_probs,
        "start_top_index": start_top_index,
        "end_top_log_probs": end_top_log_probs,
        "end_top_index": end_top_index,
        "cls_logits": cls_logits,
    }


# ----- running the graphs -------------------------------------------------------------------------------------------


def _session(build, checkpoint=None, setup=None):
    """Builds a graph and a session whose variables are restored from `checkpoint` (a prefix) or set by
    `setup(session)` (run inside the graph, e.g. to randomise and save them). Returns (session, build's result)."""
    tf = _tf()
    graph = tf.Graph()
    with graph.as_default():
        built = build()
        session = tf.Session(graph=graph)
        if checkpoint is not None:
            tf.train.Saver().restore(session, checkpoint)
        else:
            setup(session)
    return session, built


def run_transformer_xl(spec, segments, checkpoint=None, setup=None):
    """The LM over consecutive `segments` ([len, batch] int arrays) carrying the memory, starting from mem_len zero
    vectors as train_gpu.py does. Returns one {"log_probs", "mems" [n_layer, mem_len, batch, d_model]} per segment."""
    tf = _tf()
    batch, n_layer, d_model = segments[0].shape[1], spec["n_layer"], spec["d_model"]

    def build():
        ids = tf.placeholder(tf.int32, [None, batch])
        mems = [tf.placeholder(tf.float32, [None, batch, d_model]) for _ in range(n_layer)]
        return ids, mems, *transformer_xl_lm(ids, mems, spec)

    session, (ids, mems, log_probs, new_mems) = _session(build, checkpoint, setup)
    memory = [np.zeros((spec["mem_len"], batch, d_model), np.float32)] * n_layer
    results = []
    with session:
        for segment in segments:
            probs, memory = session.run([log_probs, new_mems], {ids: segment, **dict(zip(mems, memory))})
            results.append({"log_probs": probs, "mems": np.stack(memory)})
    return results


def _xlnet_heads(output, table, heads, inputs):
    tf = _tf()
    results, summary = {}, {}
    for head in heads:
        kind = head["kind"]
        if kind == "lm":
            results["lm"] = xlnet_lm_logits(output, table)
            continue
        if kind == "squad":
            for key, value in xlnet_squad_outputs(
                output, inputs["p_mask"], inputs["cls_index"], head["start_n_top"], head["end_n_top"]
            ).items():
                results[f"squad/{key}"] = value
            continue
        if "pooled" not in summary:
            summary["pooled"] = xlnet_summary(output, head.get("use_proj", True))
        pooled = summary["pooled"]
        if kind == "classification":
            logits = xlnet_classification_logits(pooled, head["n_class"], head["task"])
            results[f"classification_{head['task']}"] = logits
        elif kind == "regression":
            results[f"regression_{head['task']}"] = xlnet_regression_logits(pooled, head["task"])
        elif kind == "race":
            results["race"] = xlnet_race_logits(pooled, head["num_choices"])
        else:
            raise ValueError(f"unknown XLNet head {kind!r}")
    return results


def run_xlnet(spec, heads, segments, checkpoint=None, setup=None, mask_emb=False):
    """XLNet over consecutive `segments`, each a dict of numpy inputs: "input_ids" [len, batch] and optionally
    "seg_ids" [len, batch], "input_mask" [len, batch] (1 = padding), "p_mask" [batch, len], "cls_index" [batch].
    Segments after the first attend to the memory (mem_len from spec). `heads`: dicts with "kind" (lm,
    classification, regression, race, squad) and their parameters. Returns one {output name: array, "mems"} per
    segment."""
    tf = _tf()
    first = segments[0]
    batch, n_layer, d_model = first["input_ids"].shape[1], spec["n_layer"], spec["d_model"]

    def build():
        feeds = {"input_ids": tf.placeholder(tf.int32, [None, batch])}
        if "seg_ids" in first:
            feeds["seg_ids"] = tf.placeholder(tf.int32, [None, batch])
        if "input_mask" in first:
            feeds["input_mask"] = tf.placeholder(tf.float32, [None, batch])
        if "p_mask" in first:
            feeds["p_mask"] = tf.placeholder(tf.float32, [batch, None])
            feeds["cls_index"] = tf.placeholder(tf.int32, [batch])
        mems = [tf.placeholder(tf.float32, [None, batch, d_model]) for _ in range(n_layer)]
        output, new_mems, table = xlnet_encoder(
            feeds["input_ids"], feeds.get("seg_ids"), feeds.get("input_mask"), mems, spec, mask_emb=mask_emb
        )
        return feeds, mems, new_mems, _xlnet_heads(output, table, heads, feeds)

    session, (feeds, mems, new_mems, outputs) = _session(build, checkpoint, setup)
    memory = [np.zeros((0, batch, d_model), np.float32)] * n_layer
    results = []
    with session:
        for segment in segments:
            feed = {feeds[name]: value for name, value in segment.items()}
            values, memory = session.run([outputs, new_mems], {**feed, **dict(zip(mems, memory))})
            results.append({**values, "mems": np.stack(memory)})
    return results
