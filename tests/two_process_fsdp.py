"""One rank of the FSDP run in test_training_accelerate.py: `accelerate launch --use_fsdp ... two_process_fsdp.py OUT
MODEL:SHARDING...`, or `python two_process_fsdp.py OUT MODEL...` alone for the one-process reference.

Each MODEL (`transfo-xl`, `xlnet`; `transformers-xlnet`, transformers' own XLNet, is a control to run by hand: its
head ignores Trainer's `num_items_in_batch`, so its loss and gradient are the number of processes times one
process's, and gradient clipping makes its later steps differ a little)
trains 3 steps with `MemoryTrainer` on a 4-row stream (2 rows per rank) with the memory carried. SHARDING:
`layers` (`fully_shard` on each layer of the model's `_no_split_modules`, then on the model, by hand), `model`
(on the model only) or `accelerate` (accelerate's auto-wrap policy does it). Each rank writes OUT/rank{r}.json: per
run, the logged losses, for each forward whether it was fed an empty memory or exactly the one its previous
forward returned, and how the weights are held (the FSDP units, each weight's share of its elements on this rank).

accelerate chooses FSDP only on accelerators: on CPU its state is MULTI_CPU, whose branch of
`AcceleratorState.__init__` never selects FSDP, so `--use_fsdp` on CPU prepares the model with DDP. Under
`--use_fsdp` this script sets the state accelerate sets on GPUs (`shard_on_cpu`); from there everything is the
code a GPU run uses: Trainer's FSDP path and accelerate's `fsdp2_prepare_model` (`fully_shard` on each layer its
auto-wrap policy names, then on the model), over gloo.
"""

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.state import DistributedType, PartialState
from accelerate.utils import FullyShardedDataParallelPlugin
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from transformers import TrainingArguments
from transformers import XLNetConfig as TransformersXLNetConfig
from transformers import XLNetLMHeadModel as TransformersXLNetLMHeadModel

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, XLNetConfig, XLNetLMHeadModel
from transformers_xl.training import MemoryTrainer, TextStream

TOKENS = 4 * 40  # 4 rows of 40 tokens: 5 segments of 8
ROWS, SEQ_LEN, MEM_LEN = 4, 8, 8


def build(name):
    torch.manual_seed(0)
    if name == "transfo-xl":
        # Adaptive clusters, each softmax layer tied to its embedding table and the tail projections tied too (as
        # wt103's): FSDP must see every tie (accelerate's path finds them through `.weight` of the two embeddings).
        config = TransfoXLConfig(
            vocab_size=TOKENS, cutoffs=[40, 80], div_val=2, tie_projs=[False, True, True], d_model=16, d_embed=16,
            n_head=2, d_head=8, d_inner=32, n_layer=2, mem_len=MEM_LEN, clamp_len=-1, same_length=False, dropout=0.0,
            dropatt=0.0,
        )  # fmt: skip
        return TransfoXLLMHeadModel(config)
    xlnet = {"vocab_size": TOKENS, "d_model": 16, "n_head": 2, "d_inner": 32, "n_layer": 2, "mem_len": MEM_LEN,
             "use_mems_train": True, "dropout": 0.0}  # fmt: skip
    if name == "xlnet":
        return XLNetLMHeadModel(XLNetConfig(**xlnet))
    return TransformersXLNetLMHeadModel(TransformersXLNetConfig(**xlnet))


class AsLabels(torch.utils.data.Dataset):
    """A `TextStream` whose targets are `labels` (transformers' XLNet does not take `shift_labels`; its `labels`
    are not shifted either)."""

    def __init__(self, stream):
        self.stream = stream
        self.num_rows = stream.num_rows

    def __len__(self):
        return len(self.stream)

    def __getitem__(self, index):
        item = self.stream[index]
        return {"input_ids": item["input_ids"], "labels": item["shift_labels"]}


def shard_on_cpu(layer_classes):
    """The state `accelerate launch --use_fsdp` gives on GPUs, on CPU (see the module docstring), with a plugin of
    its own for each model: accelerate writes into it the layer classes of the model it prepares."""
    state = Accelerator(cpu=True).state
    assert state.distributed_type in (DistributedType.MULTI_CPU, DistributedType.FSDP), state.distributed_type
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    # from the launcher's settings, as Accelerator makes it
    state.fsdp_plugin = FullyShardedDataParallelPlugin(transformer_cls_names_to_wrap=layer_classes)


def shard_by_hand(model, layer_classes, per_layer):
    """`fully_shard` on each layer (`per_layer`), then on the model: accelerate then keeps the model as it is."""
    if per_layer:
        for module in list(model.modules()):
            if type(module).__name__ in layer_classes:
                fully_shard(module)
    fully_shard(model)


def held(model):
    """Which modules are FSDP units, and each weight's share of its elements held by this rank (1.0 unsharded)."""
    units = sorted(type(module).__name__ for module in model.modules() if isinstance(module, FSDPModule))
    shares = {}
    for name, parameter in model.named_parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        shares[name] = local.numel() / parameter.numel()
    return {"units": units, "shares": shares}


def train(spec, out, sharded):
    name, _, sharding = spec.partition(":")
    model = build(name)
    calls = []

    def record(module, args, kwargs, output):
        mems = kwargs.get("mems")
        fed = "empty" if mems is None else all(torch.equal(a, b) for a, b in zip(mems, calls[-1], strict=True))
        calls.append(fed)
        calls.append([m.clone() for m in output.mems])

    model.register_forward_hook(record, with_kwargs=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if sharded:
        layer_classes = getattr(model, "_no_split_modules", None) or ["XLNetLayer"]  # (transformers' XLNet has none)
        # (sharded by hand, the layers' classes are renamed FSDP...: the plugin would look for the old names in vain)
        shard_on_cpu(layer_classes if sharding == "accelerate" else None)
        if sharding != "accelerate":
            shard_by_hand(model, layer_classes, per_layer=sharding == "layers")
    args = TrainingArguments(
        output_dir=os.path.join(out, spec.replace(":", "-")), per_device_train_batch_size=ROWS // world, max_steps=3,
        use_cpu=True, report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0, learning_rate=1e-2,
        accelerator_config={"use_configured_state": sharded},  # (keep shard_on_cpu's state)
    )  # fmt: skip
    data = TextStream(torch.arange(TOKENS), ROWS, SEQ_LEN)  # token i at stream position i
    trainer = MemoryTrainer(model=model, args=args, train_dataset=AsLabels(data) if "transformers" in name else data)
    trainer.train()
    return {
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "fed_previous_memory": calls[::2],
        **held(trainer.model),
    }


def main(out, specs):
    sharded = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    result = {spec: train(spec, out, sharded) for spec in specs}
    Path(out).mkdir(parents=True, exist_ok=True)
    Path(out, f"rank{PartialState().process_index}.json").write_text(json.dumps(result))
    # Leave the process group before exiting: a gloo group still alive at interpreter exit can abort the process.
    PartialState().destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
