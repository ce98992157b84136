"""Fixtures shared by the test modules, and the hypothesis profiles of the property tests."""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from transformers import Trainer, TrainingArguments

# The test models are too small for torch's threads to pay: their per-op synchronisation only adds CPU time (two
# of the property tests: 24 s of CPU with 2 threads, 13 s with 1), and on shared cores a thread waits for another that
# is not running. One thread, unless OMP_NUM_THREADS says otherwise, here and in the processes the tests start (they
# inherit the variable): README.md's training block, run by two test processes side by side on 2 cores, took 33 s
# each on torch's default 2 threads, 7 s on 1.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"

# Property tests (tests/test_properties_*.py). `ci`, the default, is reproducible and bounded: a fixed number of
# derandomized examples per test (the same every run) and no deadline, since one example builds and runs small
# models and the CI machines have 2 shared cores. It reports a failing example as found, without shrinking it:
# shrinking reruns the test until hypothesis' limit of 5 minutes per failing test. `dev` searches wider with fresh
# random examples and shrinks what fails to a minimal example; choose it with HYPOTHESIS_PROFILE=dev.
settings.register_profile(
    "ci", max_examples=50, deadline=None, derandomize=True, database=None, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
settings.register_profile(
    "dev", max_examples=200, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # fmt: skip
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


class _Rows(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


@pytest.fixture
def trainer_step_update(tmp_path):
    """`update(make_model, rows, batch_size, accumulation)`: the parameter change of one Trainer SGD step (lr 1, no
    clipping, no decay) on `rows` of a fresh `make_model()`, keyed by parameter name."""

    def update(make_model, rows, batch_size, accumulation):
        model = make_model()
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        args = TrainingArguments(
            output_dir=str(tmp_path / f"run{batch_size}x{accumulation}"), per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1.0, optim="sgd",
            lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1e9, report_to=[], use_cpu=True,
            save_strategy="no", logging_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        Trainer(model=model, args=args, train_dataset=_Rows(rows)).train()
        return {name: before[name] - p.detach() for name, p in model.named_parameters()}

    return update
