"""One rank of the two-process run in test_training_accelerate.py: `accelerate launch ... two_process_training.py OUT`.

A tiny Transformer-XL trains 3 steps on a 4-row stream (2 rows per rank), checkpoints at step 2 and evaluates;
each rank writes OUT/rank{r}.json: the world size, the token rows it read, for each forward whether it was
fed an empty memory or exactly the one its previous forward returned, and the evaluation metrics.
"""

import json
import os
import sys
from pathlib import Path

import torch
from transformers import TrainingArguments

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.training import MemoryTrainer, TextStream

TOKENS = 4 * 40  # 4 rows of 40 tokens: 5 segments of 8


def main(out):
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=TOKENS, cutoffs=[], adaptive=False, div_val=1, d_model=16, d_embed=16, n_head=2, d_head=8,
        d_inner=32, n_layer=2, mem_len=8, clamp_len=-1, same_length=False, dropout=0.0, dropatt=0.0,
    )  # fmt: skip
    model = TransfoXLLMHeadModel(config)
    calls = []

    def record(module, args, kwargs, output):
        mems = kwargs.get("mems")
        fed = "empty" if mems is None else all(torch.equal(a, b) for a, b in zip(mems, calls[-1]["mems"], strict=True))
        calls.append({"ids": kwargs["input_ids"], "mems": [m.clone() for m in output.mems], "fed": fed})

    model.register_forward_hook(record, with_kwargs=True)
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, per_device_eval_batch_size=2, max_steps=3, use_cpu=True,
        report_to=[], save_strategy="steps", save_steps=2, logging_strategy="no", disable_tqdm=True, seed=0,
    )  # fmt: skip
    ids = torch.arange(TOKENS)  # token i at stream position i: a row's tokens say where it was read
    trainer = MemoryTrainer(
        model=model, args=args, train_dataset=TextStream(ids, 4, 8), eval_dataset=TextStream(ids, 4, 8)
    )
    trainer.train()
    training_calls = len(calls)
    metrics = trainer.evaluate()
    result = {
        "world_size": args.world_size,
        "rows": [torch.cat([c["ids"][row] for c in calls[:training_calls]]).tolist() for row in range(2)],
        "fed_previous_memory": [c["fed"] for c in calls],
        "eval_loss": metrics["eval_loss"],
    }
    Path(out, f"rank{args.process_index}.json").write_text(json.dumps(result))
    # Leave the process group, then skip the interpreter's teardown: gloo's threads can still abort a finished rank
    # there ("terminate called without an active exception", seen on a loaded machine) after its results are written.
    trainer.accelerator.end_training()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
