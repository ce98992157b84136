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
git checkout of transformers has them: copy its `tests/generation` and `tests/exporters` into the unpacked folder
(and, where `generation/test_utils.py` imports `tests.exporters`, make that import relative, `..exporters`).
"""

import inspect
import os
import sys
import types
import unittest
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel, StaticCache

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
# Copies of the generation tests older than transformers 5.25 skip assisted decoding for models whose class says
# `_is_stateful`, which 5.25 removed (its `generate()` asks the cache, `is_croppable`): give them 5.24's default.
if not hasattr(PreTrainedModel, "_is_stateful"):
    PreTrainedModel._is_stateful = False
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
        config = ours.XLNetConfig(
            vocab_size=self.vocab_size, d_model=32, n_head=4, d_inner=37, n_layer=2, mem_len=self.mem_len,
            clamp_len=-1, dropout=0.0, bos_token_id=1, eos_token_id=2, pad_token_id=5, num_labels=self.num_labels,
        )  # fmt: skip
        # transformers' generation tests run their cached paths only where the config has `use_cache`. XLNet's has
        # none (nor has transformers'): its memory is `use_mems_eval`, on here; XLNet ignores `use_cache`.
        config.use_cache = True
        return config

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

    # The copy decorates this test with a bare `@is_flaky` (a decorator factory), so it returns without running:
    # run the test itself (the factory's first argument).
    test_prompt_lookup_decoding_matches_greedy_search_here = inspect.getclosurevars(
        GenerationTesterMixin.test_prompt_lookup_decoding_matches_greedy_search
    ).nonlocals.get("max_attempts")

    def _check_past_key_values_for_generate(self, batch_size, past_key_values, seq_length, config):
        """The memory holds the newest positions only, as many as the cache's `get_max_length()` (the default cache's
        mem_len, the static cache's slots): transformers expects every position of the generation."""
        capacity = past_key_values.get_max_length()
        super()._check_past_key_values_for_generate(batch_size, past_key_values, min(seq_length, capacity), config)

    def _check_attentions_for_generate(
        self, batch_size, attentions, prompt_length, output_length, config, decoder_past_key_values
    ):
        """With the static cache, the prompt runs as with the default cache: its attentions span memory + prompt
        (transformers expects the slots, as its StaticCache's prefill attends to them all)."""
        cache = decoder_past_key_values
        if not isinstance(cache, StaticCache):
            return super()._check_attentions_for_generate(
                batch_size, attentions, prompt_length, output_length, config, cache
            )
        self.assertEqual(len(attentions), output_length - prompt_length)
        for generated_length, step in enumerate(attentions):
            shape = (prompt_length, prompt_length) if generated_length == 0 else (1, cache.get_max_length())
            self.assertEqual([tuple(layer.shape) for layer in step], [(batch_size, config.n_head, *shape)] * len(step))


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

    def prepare_config_and_inputs_for_generate(self, batch_size=2):
        """As transformers' XLNet tester: the prompt's ids only (segment ids and `predict_next_token` exclude each
        other) and its reuse_len of 15."""
        config, inputs = super().prepare_config_and_inputs_for_generate(batch_size)
        config.reuse_len = 15
        return config, {"input_ids": inputs["input_ids"]}

    def _check_hidden_states_for_generate(
        self, batch_size, hidden_states, prompt_length, output_length, config, use_cache=False
    ):
        """Our XLNet's generation (docs/generation.md), no dummy token: the prompt, then with the memory its last two
        tokens again; per layer the content stream's states, then the query stream's (the next position)."""
        self.assertEqual(len(hidden_states), output_length - prompt_length)
        for generated_length, step in enumerate(hidden_states):
            rows = 2 if generated_length else prompt_length
            expected = [(batch_size, rows, config.d_model), (batch_size, 1, config.d_model)] * (config.n_layer + 1)
            self.assertEqual([tuple(states.shape) for states in step], expected)

    def _check_attentions_for_generate(
        self, batch_size, attentions, prompt_length, output_length, config, decoder_past_key_values
    ):
        """As the hidden states, each layer's (content, query stream) attentions, over the memory and the tokens fed
        (after the prompt: a static cache's slots, `get_max_length()`)."""
        self.assertEqual(len(attentions), output_length - prompt_length)
        for generated_length, step in enumerate(attentions):
            rows, keys = (2, prompt_length + generated_length) if generated_length else (prompt_length, prompt_length)
            if generated_length and isinstance(decoder_past_key_values, StaticCache):
                keys = decoder_past_key_values.get_max_length()
            expected = [((batch_size, config.n_head, rows, keys), (batch_size, config.n_head, 1, keys))] * len(step)
            self.assertEqual([tuple(tuple(probs.shape) for probs in layer) for layer in step], expected)

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
