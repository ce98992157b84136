"""transformers' own common model tests (`ModelTesterMixin`, and `GenerationTesterMixin` where available) run
against our Transformer-XL and XLNet heads.

Not part of our suite: pytest does not collect it (not named `test_*`) and CI cannot download transformers' tests.
What it found, and which of transformers' tests do not apply to these models and why: docs/models.md,
"transformers' common tests". To rerun it, unpack the installed transformers' sdist (it ships `tests/`) and point
`TRANSFORMERS_TESTS` at that folder:

    scratch=$(mktemp -d)
    pip download transformers==$(python -c "import transformers; print(transformers.__version__)") \
        --no-binary :all: --no-deps -d "$scratch" && tar xzf "$scratch"/transformers-*.tar.gz -C "$scratch"
    pip install --target "$scratch/deps" parameterized   # transformers' tests import it; our venv does not need it
    PYTHONPATH="$scratch/deps" TRANSFORMERS_TESTS=$(ls -d "$scratch"/transformers-*/tests) HF_HUB_OFFLINE=1 \
        OMP_NUM_THREADS=1 python -m pytest -n 0 -v --tb=native -rfEs tests/transformers_common_harness.py

The sdist's `tests/` holds `test_modeling_common.py` but neither `generation/test_utils.py` nor
`exporters/test_export.py`: missing ones are replaced by empty mixins, and the generation tests are then skipped. A
git checkout of transformers at the same version's tag has them all.
"""

import inspect
import os
import sys
import types
import unittest
from pathlib import Path

import pytest
import torch

from transformers.models.auto import modeling_auto as auto

import transformers_xl as ours

TESTS = os.environ.get("TRANSFORMERS_TESTS")
if not TESTS or not (Path(TESTS) / "test_modeling_common.py").is_file():
    pytest.skip("set TRANSFORMERS_TESTS to an unpacked transformers tests/ folder", allow_module_level=True)


def _import_transformers_tests(root: Path):
    """transformers' tests/ as package `transformers_tests` (its modules import each other relatively), with empty
    mixins for the modules this copy lacks."""
    package = types.ModuleType("transformers_tests")
    package.__path__ = [str(root)]
    sys.modules["transformers_tests"] = package
    for subpackage, module, mixin in (("exporters", "test_export", "ExportTesterMixin"),
                                      ("generation", "test_utils", "GenerationTesterMixin")):  # fmt: skip
        if (root / subpackage / f"{module}.py").is_file():
            continue
        parent = types.ModuleType(f"transformers_tests.{subpackage}")
        parent.__path__ = []
        stub = types.ModuleType(f"transformers_tests.{subpackage}.{module}")
        setattr(stub, mixin, type(mixin, (), {"missing_from_this_copy": True}))
        sys.modules[parent.__name__], sys.modules[stub.__name__] = parent, stub
    import transformers_tests.test_modeling_common as common  # noqa: PLC0415

    return common, sys.modules["transformers_tests.generation.test_utils"]


common, generation = _import_transformers_tests(Path(TESTS))
ids_tensor, random_attention_mask = common.ids_tensor, common.random_attention_mask
GenerationTesterMixin = generation.GenerationTesterMixin


class TransfoXLModelTester:
    """A tiny Transformer-XL (adaptive input and softmax with 3 clusters, a memory longer than a segment), about the
    sizes of transformers 4.x's own tester for it; the cutoffs stay below the vocabulary of 10 that
    `test_load_with_mismatched_shapes` resizes to."""

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99):
        self.parent, self.batch_size, self.seq_length, self.vocab_size = parent, batch_size, seq_length, vocab_size
        self.is_training, self.hidden_size, self.num_hidden_layers, self.num_attention_heads = True, 32, 2, 4
        self.mem_len, self.num_labels = 30, 3  # no key_length: the first segment has no memory yet

    def get_config(self):
        return ours.TransfoXLConfig(
            vocab_size=self.vocab_size, cutoffs=[4, 8], d_model=32, d_embed=32, n_head=4, d_head=8,
            d_inner=37, div_val=2, n_layer=2, mem_len=self.mem_len, clamp_len=15, dropout=0.0, dropatt=0.0,
            eos_token_id=0, pad_token_id=98,
            num_labels=self.num_labels,
        )  # fmt: skip

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 1)
        return self.get_config(), {"input_ids": input_ids}


class XLNetModelTester(TransfoXLModelTester):
    """A tiny XLNet with a memory and an attention mask, the sizes of transformers' own XLNet tester."""

    def __init__(self, parent, batch_size=14, seq_length=7, vocab_size=99):
        super().__init__(parent, batch_size, seq_length, vocab_size)
        self.mem_len, self.num_choices = 10, 4
        self.num_labels = 2  # XLNetForQuestionAnsweringSimple: one start and one end logit per token

    def get_config(self):
        return ours.XLNetConfig(
            vocab_size=self.vocab_size, d_model=32, n_head=4, d_inner=37, n_layer=2, mem_len=self.mem_len,
            clamp_len=-1, dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=5, num_labels=self.num_labels,
        )  # fmt: skip

    def prepare_config_and_inputs_for_common(self):
        config, inputs = super().prepare_config_and_inputs_for_common()
        inputs["attention_mask"] = random_attention_mask([self.batch_size, self.seq_length])
        inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], 2)  # trains the segment terms
        return config, inputs


class _OurModelsTest(common.ModelTesterMixin, GenerationTesterMixin):
    make_tester = None

    def setUp(self):
        self.model_tester = self.make_tester(self)

    # transformers runs these only on an accelerator (and the compile ones only with RUN_SLOW): run them here too.
    # On a CPU, test_sdpa_can_compile_dynamic still skips itself; test_flex_attention_with_grads runs a forward with
    # gradients enabled (on a CPU our flex_attention runs sdpa then: torch 2.13 has no CPU flex backward).
    test_flex_attention_with_grads_here = inspect.unwrap(common.ModelTesterMixin.test_flex_attention_with_grads)
    test_torch_compile_for_training_here = inspect.unwrap(common.ModelTesterMixin.test_torch_compile_for_training)


# transformers' tests pick labels and skip base models by looking up its own name mappings, which lost Transformer-XL
# in v5: give them back the entries transformers 4.x had.
for mapping, class_name in ((auto.MODEL_MAPPING_NAMES, "TransfoXLModel"),
                            (auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "TransfoXLLMHeadModel"),
                            (auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, "TransfoXLForSequenceClassification")):  # fmt: skip
    mapping.setdefault("transfo-xl", class_name)


class TransfoXLCommonTest(_OurModelsTest, unittest.TestCase):
    make_tester = TransfoXLModelTester
    _torch_compile_train_cls = ours.TransfoXLLMHeadModel
    all_model_classes = (ours.TransfoXLModel, ours.TransfoXLLMHeadModel, ours.TransfoXLForSequenceClassification)


class XLNetCommonTest(_OurModelsTest, unittest.TestCase):
    make_tester = XLNetModelTester
    _torch_compile_train_cls = ours.XLNetLMHeadModel
    all_model_classes = (
        ours.XLNetModel, ours.XLNetLMHeadModel, ours.XLNetForSequenceClassification, ours.XLNetForTokenClassification,
        ours.XLNetForMultipleChoice, ours.XLNetForQuestionAnsweringSimple, ours.XLNetForQuestionAnswering,
    )  # fmt: skip

    @classmethod
    def setUpClass(cls):
        ours.use_for_auto_classes()  # the tests load through AutoModel*: ours, not transformers' built-in XLNet

    @classmethod
    def tearDownClass(cls):
        ours.use_builtin_auto_classes()

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        """The SQuAD head (beam search over spans) is not in transformers' question-answering mapping: its labels
        are start and end positions as well."""
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels)
        if return_labels and model_class is ours.XLNetForQuestionAnswering:
            positions = torch.zeros(self.model_tester.batch_size, dtype=torch.long)
            inputs_dict.update(start_positions=positions, end_positions=positions.clone())
        return inputs_dict
