"""Transformer-XL is shaped for GPUs: a training step or an evaluation forward with labels makes at most one host
sync per adaptive-softmax tail cluster (the count of its rows), a decoding step none (counted with `HostSyncCounter`,
the ops a GPU would sync the host on)."""

import torch

from host_syncs import HostSyncCounter
from test_modeling_transfo_xl import random_ids, tiny_lm
from transformers_xl.modeling.memory_cache import MemoryCache

TAIL_CLUSTERS = 2  # (tiny_lm: cutoffs [20, 50])


def test_a_training_step_syncs_once_per_tail_cluster():
    model = tiny_lm(dropout=0.1, dropatt=0.1).train()
    ids = random_ids(2, 6)
    mems = model(ids).mems
    labels = ids.clone()
    labels[0, 2] = -100
    with HostSyncCounter() as syncs:
        model(ids, mems=mems, labels=labels).loss.backward()
    assert syncs.count <= TAIL_CLUSTERS and set(syncs.ops) <= {"nonzero"}, syncs.ops


def test_an_evaluation_forward_with_labels_syncs_once_per_tail_cluster():
    model = tiny_lm()
    ids = random_ids(2, 6)
    with torch.no_grad():
        mems = model(ids).mems
        with HostSyncCounter() as syncs:
            model(ids, mems=mems, labels=ids)
    assert syncs.count <= TAIL_CLUSTERS and set(syncs.ops) <= {"nonzero"}, syncs.ops


def test_a_decoding_step_makes_no_host_sync():
    model = tiny_lm(same_length=True)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    with torch.no_grad():
        model(random_ids(2, 5), cache=cache)
        model(random_ids(2, 1), cache=cache)  # (the position keys' table grows: amortised, as every later step's)
        with HostSyncCounter() as syncs:
            model(random_ids(2, 1, seed=3), cache=cache)
    assert syncs.count == 0, syncs.ops
