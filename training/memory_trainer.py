"""`MemoryTrainer`: transformers' Trainer with the model's memory (`mems`) carried from one step to the next.

Segment-level recurrence (Transformer-XL Sec. 3.2) needs two things Trainer does not do: the data in stream order
with fixed rows (`TextStream` + the sequential sampler below), and the `mems` a step returns fed to the next step.
transformers v5 removed Trainer's only hook for the latter (`past_index`), so this subclass does it in
`compute_loss`. It is model-agnostic: it passes `mems=` and reads `outputs.mems`, a tuple of time-major
`[mem_len, rows, d]` tensors (Transformer-XL; XLNet too, with `config.use_mems_train=True`).

The memory's life:
- training: one memory, fed micro-batch after micro-batch in dataloader order, detached (no gradient crosses a
  segment boundary). With the step-major stream, consecutive micro-batches are consecutive segments of the same
  rows, so under gradient accumulation one optimizer step covers `gradient_accumulation_steps` consecutive
  segments (truncated back-propagation through time, one segment deep); it is emptied at each epoch start;
- evaluation: its own memory, empty at the start of every evaluation and dropped after it; evaluating in the
  middle of training leaves the training memory untouched;
- checkpoints: each process saves its training memory next to the checkpoint (`memory-rank{r}.safetensors`); a
  resume reloads it, so the resumed run continues the same rows with the same memory as an uninterrupted run. A
  checkpoint taken at the end of an epoch, or `ignore_data_skip=True` (which restarts the epoch's data) resume
  with an empty memory.

Checkpoints are complete or absent: Trainer writes each into `OUTPUT/.partial/checkpoint-N`, every process adds its
memory, then the main process lists the files and their sizes in `checkpoint-files.json` and renames the folder to
`OUTPUT/checkpoint-N`. `train(resume_from_checkpoint=True)` takes the last checkpoint whose listed files are all
there with their sizes, and warns about the later ones it skips (a kill during a save, a disk that filled up, a
file deleted since).

Several processes: launch with `accelerate launch` / `torchrun` (DDP); each rank keeps the memory of its own rows.
On CPU pass `use_cpu=True` (or `ACCELERATE_USE_CPU=true`), otherwise each process trains alone. `nn.DataParallel`
(several GPUs in one process) is refused: it would split the time-major memory along time. FSDP (`accelerate launch
--use_fsdp`, FSDP2 per layer) shards the weights and leaves the memory per rank; it is refused where accelerate
would not shard (on CPU it picks DDP), rather than silently holding the whole model in every process.
"""

import contextlib
import json
import math
import os
import shutil
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints
from transformers.utils import logging

from ..conversion.publish import umask_permissions
from .streams import TextStream

logger = logging.get_logger(__name__)

CHECKPOINT_FILES = "checkpoint-files.json"  # written last into a checkpoint: its files and their sizes
STAGING = ".partial"  # checkpoints are written in OUTPUT/.partial/checkpoint-N, then renamed into OUTPUT


def checkpoint_problem(checkpoint) -> str | None:
    """None for a complete checkpoint (every file listed in its CHECKPOINT_FILES there, with its size), else what
    is wrong with it, in a few words."""
    try:
        with open(os.path.join(checkpoint, CHECKPOINT_FILES), encoding="utf-8") as file:
            files = json.load(file)["files"]
        sizes = {str(name): int(size) for name, size in files.items()}
    except FileNotFoundError:
        return f"no {CHECKPOINT_FILES}: not written to the end"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"a damaged {CHECKPOINT_FILES}"
    for name, size in sizes.items():
        path = os.path.join(checkpoint, name)
        if not os.path.isfile(path):
            return f"no {name}"
        if os.path.getsize(path) != size:
            return f"{name} has {os.path.getsize(path)} bytes, not {size}"
    return None


def last_complete_checkpoint(folder) -> tuple[str | None, list[tuple[str, str]]]:
    """The complete checkpoint of the highest step in `folder` (or None), and the later ones skipped, as
    (path, problem)."""
    steps = {}
    for name in os.listdir(folder):
        prefix, _, step = name.partition("-")
        if prefix == PREFIX_CHECKPOINT_DIR and step.isdigit() and os.path.isdir(os.path.join(folder, name)):
            steps[int(step)] = os.path.join(folder, name)
    skipped = []
    for step in sorted(steps, reverse=True):
        problem = checkpoint_problem(steps[step])
        if problem is None:
            return steps[step], skipped
        skipped.append((steps[step], problem))
    return None, skipped


class MemoryTrainer(Trainer):
    """Trainer whose steps pass each other the model's `mems`; evaluation reports loss, perplexity and bits.

    Use it like Trainer, with `TextStream` datasets whose `num_rows` is the global batch (per-device batch size x
    number of processes):

        trainer = MemoryTrainer(model=model, args=args, train_dataset=TextStream(train_ids, 8, 128),
                                eval_dataset=TextStream(valid_ids, 8, 128))
        trainer.train()
        trainer.evaluate()  # eval_loss (nats per predicted token), eval_perplexity, eval_bits_per_token

    `eval_loss` is the mean over every predicted token of the eval stream (Trainer's own is a mean of batch
    means): with a `TextStream`, exactly the original `eval.py`'s loss; for a character-level model
    `eval_bits_per_token` is bits per character.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.args.n_gpu > 1:
            raise ValueError(
                "MemoryTrainer: several GPUs in one process (nn.DataParallel) would split the time-major memory "
                "along time; launch one process per GPU (`accelerate launch` or `torchrun`) instead."
            )
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > self.args.world_size:
            raise ValueError(
                f"MemoryTrainer: {launched} processes were launched but each trains alone (world size "
                f"{self.args.world_size}); on CPU pass `use_cpu=True` to TrainingArguments (or set "
                "ACCELERATE_USE_CPU=true) so that they train together over gloo."
            )
        fsdp_requested = self.args.fsdp or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if fsdp_requested and self.accelerator.distributed_type != DistributedType.FSDP:
            raise ValueError(
                "MemoryTrainer: FSDP was requested, but accelerate prepares this run as "
                f"{self.accelerator.distributed_type.value} (it shards only on GPUs and other accelerators, under "
                "`accelerate launch` or `torchrun`; on CPU it runs DDP), so each process would hold the whole model."
            )
        self._memory = {"train": None, "eval": None}
        self._mode = "train"
        self._restored_memory = None
        self._staging_root = None
        self._eval_totals = None
        self._warned_no_mems = False
        self.add_callback(_MemoryLifecycle(self))

    # --- data: stream order, fixed rows ---------------------------------------------------------------------

    def _get_train_sampler(self, train_dataset=None):
        """Stream order: never shuffled (a shuffled segment would meet another row's memory)."""
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return torch.utils.data.SequentialSampler(dataset)

    def _get_eval_sampler(self, eval_dataset):
        return torch.utils.data.SequentialSampler(eval_dataset)

    def get_train_dataloader(self):
        self._check_rows(self.train_dataset, self._train_batch_size, "per_device_train_batch_size")
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset=None):
        dataset = self.eval_dataset[eval_dataset] if isinstance(eval_dataset, str) else eval_dataset
        self._check_rows(dataset if dataset is not None else self.eval_dataset, self.args.eval_batch_size,
                         "per_device_eval_batch_size")  # fmt: skip
        return super().get_eval_dataloader(eval_dataset)

    def _check_rows(self, dataset, batch_size, option):
        """A `TextStream` must have exactly one row per sequence of the global batch, or rows would change owner
        from step to step."""
        if not isinstance(dataset, TextStream):
            return
        processes = 1 if self.accelerator.split_batches else self.args.world_size
        if dataset.num_rows != batch_size * processes:
            raise ValueError(
                f"MemoryTrainer: the TextStream has {dataset.num_rows} rows but a step takes {batch_size * processes} "
                f"({option}={batch_size} x {processes} process(es)); build it with num_rows={batch_size * processes}."
            )

    # --- the memory through the steps -----------------------------------------------------------------------

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Feed the memory of the previous step of the same mode (train / eval) and keep the one returned."""
        mems = self._memory[self._mode]
        if mems is not None:
            inputs = {**inputs, "mems": mems}
        if self._mode == "eval":
            num_items_in_batch = None  # the model's own mean over this batch: times its count it is the local sum
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        new_mems = outputs.get("mems") if isinstance(outputs, dict) else None
        if new_mems is None and not self._warned_no_mems:
            logger.warning(
                "MemoryTrainer: the model returned no `mems`, so there is no memory to carry (mem_len 0, or XLNet "
                "without `config.use_mems_train=True` / `use_mems_eval=True`)."
            )
            self._warned_no_mems = True
        self._memory[self._mode] = None if new_mems is None else tuple(mem.detach() for mem in new_mems)
        if self._mode == "eval":
            count = self._predicted_tokens(inputs)
            self._eval_totals += torch.stack([loss.detach().double() * count, count.double()])
        return (loss, outputs) if return_outputs else loss

    def _predicted_tokens(self, inputs):
        """How many tokens the loss averaged over: every `shift_labels` target that is not -100; of `labels`, a
        causal LM (which shifts them inside) never scores the first."""
        if "shift_labels" in inputs:
            labels = inputs["shift_labels"]
        else:
            labels = inputs["labels"][..., 1:] if self._loss_shifts_labels else inputs["labels"]
        return labels.ne(-100).sum().to(self.args.device)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Trainer's, with a `TextStream` batch's `shift_labels` as its labels: Trainer looks for the model's label
        arguments (`labels`) and, finding none, would skip the loss (and so the memory)."""
        label_names = self.label_names
        if "shift_labels" in inputs and self.args.label_names is None:
            self.label_names = ["shift_labels"]
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        finally:
            self.label_names = label_names

    def _get_num_items_in_batch(self, batch_samples, device):
        """Trainer's count of the targets of the accumulated micro-batches (so that their loss is the mean over all
        of them), which it takes only from batches with `labels`: `TextStream` batches have `shift_labels` only."""
        if batch_samples and "labels" not in batch_samples[0] and "shift_labels" in batch_samples[0]:
            batch_samples = [{**batch, "labels": batch["shift_labels"]} for batch in batch_samples]
        return super()._get_num_items_in_batch(batch_samples, device)

    def _set_signature_columns_if_needed(self):
        """Keep `shift_labels` (`TextStream`'s targets) with `remove_unused_columns`: the LM heads take it through
        `**kwargs`, as transformers' own models do, so it is not among their named arguments."""
        super()._set_signature_columns_if_needed()
        if "shift_labels" not in self._signature_columns:
            self._signature_columns.append("shift_labels")

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):  # fmt: skip
        """Run the stream with a fresh memory of its own; report loss, perplexity and bits over every predicted
        token of every process."""
        if prediction_loss_only is None:  # the LM metrics need no logits: gather them only for compute_metrics
            prediction_loss_only = self.args.prediction_loss_only or self.compute_metrics is None
        self._mode, self._memory["eval"] = "eval", None
        self._eval_totals = torch.zeros(2, dtype=torch.float64, device=self.args.device)
        try:
            output = super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        finally:
            self._mode, self._memory["eval"] = "train", None
        nll, count = self.accelerator.reduce(self._eval_totals, reduction="sum").tolist()
        if count:
            loss = nll / count
            output.metrics[f"{metric_key_prefix}_loss"] = loss
            output.metrics[f"{metric_key_prefix}_perplexity"] = math.exp(min(loss, 700.0))
            output.metrics[f"{metric_key_prefix}_bits_per_token"] = loss / math.log(2)
        return output

    # --- checkpoints -----------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, **kwargs):
        """Trainer.train; a resume also reloads this process's training memory (see the module docstring)."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint, skipped = last_complete_checkpoint(self.args.output_dir)
            for path, problem in skipped:
                logger.warning(f"MemoryTrainer: skipped the incomplete checkpoint {path} ({problem}).")
            if resume_from_checkpoint is None:
                raise ValueError(f"MemoryTrainer: no complete checkpoint in {self.args.output_dir} to resume from.")
        elif resume_from_checkpoint and (problem := checkpoint_problem(resume_from_checkpoint)) is not None:
            raise ValueError(f"MemoryTrainer: the checkpoint {resume_from_checkpoint} is incomplete ({problem}).")
        self._restored_memory = None
        if resume_from_checkpoint and not self.args.ignore_data_skip:
            self._restored_memory = self._load_memory(resume_from_checkpoint)
        return super().train(resume_from_checkpoint=resume_from_checkpoint or None, **kwargs)

    def _save_checkpoint(self, model, trial):
        """Trainer's checkpoint, written into OUTPUT/.partial/checkpoint-N with every process's memory, listed in
        CHECKPOINT_FILES and renamed to OUTPUT/checkpoint-N when complete (see the module docstring)."""
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(self.args.output_dir, STAGING)
        staging, final = os.path.join(staging_root, name), os.path.join(self.args.output_dir, name)
        if self.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)  # (left by a run killed while saving this step)
        self.accelerator.wait_for_everyone()
        self._staging_root = staging_root
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._staging_root = None
        if not (self.state.epoch is not None and float(self.state.epoch).is_integer()):
            self._save_memory(staging)  # (at an epoch's end the next step starts with an empty memory)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            if self.state.best_model_checkpoint == staging:
                self.state.best_model_checkpoint = final
                self.state.save_to_json(os.path.join(staging, "trainer_state.json"))
            sizes = {entry.name: entry.stat().st_size for entry in os.scandir(staging) if entry.is_file()}
            with open(os.path.join(staging, CHECKPOINT_FILES), "w", encoding="utf-8") as file:
                json.dump({"files": sizes}, file, indent=2)
            umask_permissions(Path(staging))
            shutil.rmtree(final, ignore_errors=True)  # (an incomplete one of an earlier run of this step)
            os.rename(staging, final)
            with contextlib.suppress(OSError):
                os.rmdir(staging_root)  # (when no other staging folder is in it)
            rotate_checkpoints(self.args.output_dir, self.args.save_total_limit, self.state.best_model_checkpoint,
                               use_mtime=True)  # fmt: skip
        self.accelerator.wait_for_everyone()

    def _get_output_dir(self, trial):
        """While a checkpoint is saved: the staging folder, where Trainer writes it."""
        return self._staging_root or super()._get_output_dir(trial)

    def _issue_warnings_after_load(self, load_result):
        """Trainer reloads a checkpoint's weights with torch's `load_state_dict`, which lists as missing the tied
        weights `save_pretrained` leaves out of the file (e.g. `crit.out_layers.0.weight`, the embedding table's own
        tensor): they were restored with the weights they are tied to. Tie again, as `from_pretrained` does, and
        warn only about the keys that are still missing (transformers' check expects `_keys_to_ignore_on_save`)."""
        missing, tied = set(load_result.missing_keys), getattr(self.model, "all_tied_weights_keys", None) or {}
        restorable = {key for key in missing if key in tied and tied[key] not in missing}
        if restorable:
            self.model.tie_weights()
            parameters = dict(self.model.named_parameters(remove_duplicate=False))
            restored = {key for key in restorable if parameters.get(key) is parameters.get(tied[key], False)}
            load_result = load_result._replace(missing_keys=[k for k in load_result.missing_keys if k not in restored])
        super()._issue_warnings_after_load(load_result)

    def _memory_file(self, checkpoint):
        return os.path.join(checkpoint, f"memory-rank{self.args.process_index}.safetensors")

    def _save_memory(self, checkpoint):
        mems = self._memory["train"]
        if mems is None:
            return
        os.makedirs(checkpoint, exist_ok=True)
        tensors = {str(i): mem.contiguous() for i, mem in enumerate(mems)}
        save_file(tensors, self._memory_file(checkpoint), metadata={"world_size": str(self.args.world_size)})

    def _load_memory(self, checkpoint):
        path = self._memory_file(checkpoint)
        if not os.path.isfile(path):
            logger.info(f"MemoryTrainer: {checkpoint} holds no memory for this process; resuming with an empty one.")
            return None
        with safe_open(path, framework="pt", device=str(self.args.device)) as f:
            saved_world = int(f.metadata().get("world_size", -1))
            if saved_world != self.args.world_size:
                raise ValueError(
                    f"MemoryTrainer: {checkpoint} was saved by {saved_world} process(es), this run has "
                    f"{self.args.world_size}; the rows of each process (and their memory) would not match."
                )
            return tuple(f.get_tensor(key) for key in sorted(f.keys(), key=int))


class _MemoryLifecycle(TrainerCallback):
    """Empties the training memory at each epoch start (a resume mid-epoch takes the saved one instead)."""

    def __init__(self, trainer: MemoryTrainer):
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.trainer._memory["train"], self.trainer._restored_memory = self.trainer._restored_memory, None
