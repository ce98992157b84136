"""pipeline("text-generation") and streamers with both models and their tokenizers (tiny, offline)."""

import pytest
import torch
import transformers
from transformers import TextGenerationPipeline, TextStreamer, XLNetTokenizer, pipeline

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel, TransfoXLTokenizer, XLNetConfig, XLNetLMHeadModel
from weights import perturbed

WORDS = "the cat sat on mat a dog ran in park and it was very happy sun rose over hills".split()
PROMPT = "the cat sat on the mat"


def scramble(model):
    return perturbed(model).eval()


@pytest.fixture(scope="module")
def transfo_xl():
    tokenizer = TransfoXLTokenizer(vocab=["<eos>", "<unk>"] + WORDS)
    torch.manual_seed(0)
    config = TransfoXLConfig(
        vocab_size=len(tokenizer), cutoffs=[8], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=48, div_val=2,
        n_layer=2, mem_len=32, clamp_len=-1, same_length=False, dropout=0.0, eos_token_id=None,
    )  # fmt: skip
    return scramble(TransfoXLLMHeadModel(config)), tokenizer


@pytest.fixture(scope="module")
def xlnet():
    specials = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
    pieces = [(symbol, 0.0) for symbol in specials] + [("▁", -3.0)]
    pieces += [(letter, -5.0) for letter in "abcdefghijklmnopqrstuvwxyz"] + [(f"▁{w}", -2.0) for w in WORDS]
    tokenizer = XLNetTokenizer(vocab=pieces)
    torch.manual_seed(2)  # (a model whose greedy continuation is not all special tokens: the tests compare its text)
    return scramble(XLNetLMHeadModel(XLNetConfig(vocab_size=len(tokenizer), **TINY_XLNET))), tokenizer


TINY_XLNET = dict(d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0, mem_len=16, pad_token_id=5,
                  eos_token_id=None)


def forward_lengths(model):
    """Record the sequence length of every forward call (to see what the pipeline fed the model)."""
    lengths = []
    hook = model.register_forward_pre_hook(
        lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    return lengths, hook


@pytest.mark.parametrize("name", ["transfo_xl", "xlnet"])
def test_text_generation_pipeline_without_a_forced_prefix(name, request):
    model, tokenizer = request.getfixturevalue(name)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    assert isinstance(generator, TextGenerationPipeline)
    lengths, hook = forward_lengths(model)
    full = generator(PROMPT, max_new_tokens=5, do_sample=False)[0]["generated_text"]
    new = generator(PROMPT, max_new_tokens=5, do_sample=False, return_full_text=False)[0]["generated_text"]
    hook.remove()
    prompt_ids = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    assert lengths[0] <= len(prompt_ids) + 3  # the prompt (and XLNet's dummy / specials), no 140-word paragraph
    inputs = tokenizer(PROMPT, return_tensors="pt")
    expected = model.generate(**inputs, max_new_tokens=5, do_sample=False)[0, inputs["input_ids"].shape[1] :]
    assert new == tokenizer.decode(expected, skip_special_tokens=True) and new
    assert full == PROMPT + new  # transformers v5 joins the prompt and the decoded continuation as they are


def test_the_xl_prefix_is_opt_in(transfo_xl):
    model, tokenizer = transfo_xl
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    lengths, hook = forward_lengths(model)
    out = generator(PROMPT, prefix="the dog ran in the park . ", max_new_tokens=3, do_sample=False)
    hook.remove()
    assert lengths[0] == len(tokenizer("the dog ran in the park . " + PROMPT)["input_ids"])
    assert out[0]["generated_text"].startswith(PROMPT)


@pytest.mark.parametrize("name", ["transfo_xl", "xlnet"])
def test_text_streamer_prints_what_generate_returns(name, request, capsys):
    model, tokenizer = request.getfixturevalue(name)
    inputs = tokenizer(PROMPT, return_tensors="pt")
    streamer = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    output = model.generate(**inputs, max_new_tokens=6, do_sample=False, streamer=streamer)
    printed = capsys.readouterr().out.strip()
    new_tokens = output[0, inputs["input_ids"].shape[1] :]
    assert printed == tokenizer.decode(new_tokens, skip_special_tokens=True).strip() and printed


def test_batched_pipeline_pads_on_the_left(transfo_xl):
    """The tokenizer pads with <eos> (the vocabulary has no padding symbol; the attention mask hides it)."""
    model, tokenizer = transfo_xl
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompts = [PROMPT, "a dog ran"]
    batched = generator(prompts, batch_size=2, max_new_tokens=4, do_sample=False)
    alone = [generator(p, max_new_tokens=4, do_sample=False)[0] for p in prompts]
    assert [b[0]["generated_text"] for b in batched] == [a["generated_text"] for a in alone]


def test_a_tokenizer_that_ends_lines_with_eos_does_not_end_prompts(transfo_xl, tmp_path):
    """`add_eos` (the README's training tokenizer): each line read from a file ends with <eos>, a pipeline's prompt
    does not, so the pipeline continues the prompt, as with a tokenizer without `add_eos`, batched or not."""
    model, tokenizer = transfo_xl
    ending = TransfoXLTokenizer(vocab=["<eos>", "<unk>"] + WORDS, add_eos=True)
    (tmp_path / "text.txt").write_text(f"{PROMPT}\na dog ran\n")
    with open(tmp_path / "text.txt", encoding="utf-8") as lines:
        assert [row[-1] for row in ending(list(lines))["input_ids"]] == [ending.eos_token_id] * 2
    settings = dict(max_new_tokens=4, do_sample=False)
    lengths, hook = forward_lengths(model)
    out = pipeline("text-generation", model=model, tokenizer=ending)([PROMPT, "a dog ran"], batch_size=2, **settings)
    hook.remove()
    assert lengths[0] == len(tokenizer(PROMPT)["input_ids"])  # (the longer prompt, without <eos>)
    plain = pipeline("text-generation", model=model, tokenizer=tokenizer)
    assert out == [plain(prompt, **settings) for prompt in (PROMPT, "a dog ran")]


def test_batched_xlnet_pipeline_equals_transformers(xlnet):
    """XLNet's tokenizer pads with <pad> on the left; XLNet generation attends to the padding (transformers' ignores
    the attention mask, and so does ours), so a batch is compared with transformers' XLNet on the same batch."""
    model, tokenizer = xlnet
    reference = transformers.XLNetLMHeadModel(transformers.XLNetConfig(vocab_size=len(tokenizer), **TINY_XLNET))
    reference.load_state_dict(model.checkpoint_state_dict())
    prompts, settings = [PROMPT, "a dog ran"], dict(batch_size=2, max_new_tokens=4, do_sample=False)
    reference_pipeline = pipeline("text-generation", model=reference.eval(), tokenizer=tokenizer, prefix="")
    expected = reference_pipeline(prompts, **settings)  # (prefix: transformers' XLNet gets no "XL prefix" either)
    assert pipeline("text-generation", model=model, tokenizer=tokenizer)(prompts, **settings) == expected
