"""The transformers features users reach for, on both models: generate() outputs and strategies, stop strings,
configuration defaults, resizing the vocabulary, legacy outputs and arguments, building a tokenizer from raw text."""

import re
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoTokenizer,
    LogitsProcessor,
    LogitsProcessorList,
    TextStreamer,
    Trainer,
    TrainingArguments,
)

from test_generation_transfo_xl import prompt, scrambled_lm
from test_generation_xlnet import ids as xlnet_ids
from test_generation_xlnet import scrambled_pair
from test_tokenization_xlnet import tiny_tokenizer as tiny_xlnet_tokenizer
from transformers_xl import (
    TransfoXLConfig,
    TransfoXLForSequenceClassification,
    TransfoXLLMHeadModel,
    TransfoXLModel,
    TransfoXLTokenizer,
    XLNetConfig,
    XLNetLMHeadModel,
)
from transformers_xl.modeling.memory_cache import MemoryCache
from transformers_xl.modeling.modeling_transfo_xl import probe_word

ROOT = Path(__file__).parents[1]
TOKENIZER_FIXTURES = Path(__file__).parent / "fixtures" / "tokenizer"
TINY_TXL = dict(
    vocab_size=90, cutoffs=[20, 50], d_model=32, d_embed=32, n_head=4, d_head=8, d_inner=48, div_val=2, n_layer=2,
    mem_len=16, dropout=0.0,
)  # fmt: skip


def greedy(model, ids, **kwargs):
    kwargs.setdefault("max_new_tokens", 12)
    return model.generate(ids, do_sample=False, **kwargs)


def counting_forward_calls(model):
    """Make `model` count its forward calls; returns the list of each call's input length."""
    lengths, forward = [], model.forward
    model.forward = lambda *a, **k: lengths.append(k["input_ids"].shape[1]) or forward(*a, **k)
    return lengths


# --------------------------------------------------------------------------------------------------------------
# generate()
# --------------------------------------------------------------------------------------------------------------


def test_generate_returns_every_steps_attentions_and_hidden_states():
    """The keywords transformers passes through prepare_inputs_for_generation reach forward (docs/generation.md)."""
    settings = dict(max_new_tokens=3, return_dict_in_generate=True, output_attentions=True, output_hidden_states=True)
    out = greedy(scrambled_lm(), prompt(length=7), **settings)
    attentions = [[a.shape for a in step] for step in out.attentions]
    assert attentions == [[(2, 4, 7, 7)] * 2, [(2, 4, 1, 8)] * 2, [(2, 4, 1, 9)] * 2]
    hidden = [[h.shape for h in step] for step in out.hidden_states]
    assert hidden == [[(2, 7, 32)] * 3, [(2, 1, 32)] * 3, [(2, 1, 32)] * 3]

    _, xlnet = scrambled_pair(mem_len=8)
    out = greedy(xlnet, xlnet_ids(2, 7), **settings)
    # per layer (content stream, query stream); no dummy token, memory mem_len - 1 = 7, cropped by 1 each step
    attentions = [[tuple(a.shape for a in layer) for layer in step] for step in out.attentions]
    later = [((2, 4, 2, 8), (2, 4, 1, 8))] * 2
    assert attentions == [[((2, 4, 7, 7), (2, 4, 1, 7))] * 2, later, later]
    # [content, query] per layer input, then the output pair
    hidden = [[h.shape for h in step] for step in out.hidden_states]
    assert hidden == [[(2, 7, 32), (2, 1, 32)] * 3, [(2, 2, 32), (2, 1, 32)] * 3, [(2, 2, 32), (2, 1, 32)] * 3]


@pytest.mark.parametrize("strategy", ["prompt_lookup", "assistant"])
def test_transfo_xl_assisted_decoding_and_prompt_lookup_give_greedys_tokens(strategy):
    model = scrambled_lm(mem_len=64, seed=5)
    ids = torch.tensor([[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]])  # a repetitive prompt: prompt lookup finds drafts
    expected = greedy(model, ids, max_new_tokens=24, repetition_penalty=1.3)
    assert len(set(expected[0, 10:].tolist())) > 4
    if strategy == "prompt_lookup":
        helper = dict(prompt_lookup_num_tokens=3)
    else:  # a smaller model of the same kind; the model itself as its own assistant accepts every draft
        helper = dict(assistant_model=scrambled_lm(mem_len=64, seed=3, n_layer=1))
        itself = greedy(model, ids, max_new_tokens=24, repetition_penalty=1.3, assistant_model=model)
        assert torch.equal(itself, expected)
    lengths = counting_forward_calls(model)
    assert torch.equal(greedy(model, ids, max_new_tokens=24, repetition_penalty=1.3, **helper), expected)
    assert max(lengths[1:]) > 1  # drafts were verified several tokens at a time


def test_assisted_decoding_past_mem_len_keeps_the_memory_full():
    """Past mem_len the memory slides (no longer greedy's exact tokens); each rollback keeps the last mem_len."""
    model = scrambled_lm(mem_len=6)
    out = greedy(model, prompt(batch=1), max_new_tokens=16, prompt_lookup_num_tokens=3, return_dict_in_generate=True)
    assert out.sequences.shape == (1, 22)
    assert out.cache.get_seq_length() == 21 and all(layer.hidden.shape[1] == 6 for layer in out.cache.layers)


def test_memory_cache_crops_in_transformers_convention_and_records_past():
    model = scrambled_lm(mem_len=4)
    cache = MemoryCache(model.config.n_layer, model.config.mem_len)
    ids = prompt(batch=1, length=7)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        before = [layer.hidden.clone() for layer in cache.layers]
        # (transformers 5.25 on passes how many steps a recurrent layer must roll back; the memory keeps them all)
        cache.activate_past_recording(recurrent_states_to_keep=1)
        model(ids[:, 4:], cache=cache)  # 3 more positions kept past mem_len until the crop
        assert cache.is_croppable and cache.layers[0].hidden.shape[1] == 7
        cache.crop(-3)
    for layer, hidden in zip(cache.layers, before):
        torch.testing.assert_close(layer.hidden, hidden)
    cache.crop(0)  # trims to mem_len only
    assert cache.get_seq_length() == 4
    with pytest.raises(ValueError, match=r"got 2; expected minus the number of positions to remove"):
        cache.crop(2)


def test_xlnet_refuses_assisted_decoding_and_says_why():
    _, model = scrambled_pair(mem_len=8)
    _, assistant = scrambled_pair(mem_len=8, n_layer=1)
    for helper in (dict(prompt_lookup_num_tokens=2), dict(assistant_model=assistant)):
        with pytest.raises(ValueError, match="not supported.*recomputes the last two tokens"):
            greedy(model, xlnet_ids(1, 5), **helper)


class Script(LogitsProcessor):
    """Forces the generation to be `token_ids`, one per step after a prompt of `prompt_length` tokens."""

    def __init__(self, token_ids, prompt_length):
        self.token_ids, self.prompt_length = token_ids, prompt_length

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, float("-inf"))
        forced[:, self.token_ids[input_ids.shape[1] - self.prompt_length]] = 0.0
        return forced


def test_stop_strings_with_the_transfo_xl_tokenizer():
    """transformers' StopStringCriteria learns token texts after a probe word the tokenizer must give back; ours
    encodes its "abcdef" as <unk>, so generate() probes with a vocabulary word instead."""
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER_FIXTURES / "legacy")
    assert tokenizer("abcdef", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]
    assert probe_word(tokenizer) in tokenizer.get_vocab()
    model = TransfoXLLMHeadModel(TransfoXLConfig(**{**TINY_TXL, "vocab_size": len(tokenizer), "cutoffs": [100, 300]}))
    ids = tokenizer("The city was", return_tensors="pt")["input_ids"]
    script = tokenizer.convert_tokens_to_ids("the region 's report , in 1911 , was".split())
    assert tokenizer.unk_token_id not in script
    forced = LogitsProcessorList([Script(script, ids.shape[1])])
    for stop, kept in [("region's", 3), ("report,", 5), ("report, in 1911", 7)]:
        out = model.eval().generate(
            ids, max_new_tokens=9, do_sample=False, logits_processor=forced, stop_strings=[stop], tokenizer=tokenizer
        )
        assert out[0, ids.shape[1] :].tolist() == script[:kept], stop
        assert tokenizer.decode(out[0]).endswith(stop)


def test_stop_strings_with_xlnet_and_its_tokenizer():
    tokenizer = tiny_xlnet_tokenizer()
    _, model = scrambled_pair(vocab_size=len(tokenizer), mem_len=8)
    ids = tokenizer("the cat", add_special_tokens=False, return_tensors="pt")["input_ids"]
    script = tokenizer("sat on a mat and ran", add_special_tokens=False)["input_ids"]
    forced = LogitsProcessorList([Script(script, ids.shape[1])])
    out = model.generate(
        ids, max_new_tokens=6, do_sample=False, logits_processor=forced, stop_strings=["a mat"], tokenizer=tokenizer
    )
    assert tokenizer.decode(out[0]).endswith("a mat") and out.shape[1] == ids.shape[1] + 4


def test_zero_initial_mems_generates_from_a_padded_batch():
    """The mask covers the history; the zero memory slots before it stay visible, as transformers 4.x had them."""
    model = scrambled_lm(mem_len=12, zero_initial_mems=True)
    short, long = prompt(1, 4, seed=3), prompt(1, 7, seed=4)
    batch = torch.cat([torch.cat([torch.full((1, 3), 0), short], 1), long])
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    out = model.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(out[1:], greedy(model, long, max_new_tokens=6))  # the unpadded row is the row alone
    with torch.no_grad():  # the padded row: the same steps by hand
        step, tokens = model(batch, attention_mask=mask), batch
        for _ in range(6):
            next_token = step.logits[:, -1].argmax(-1, keepdim=True)
            tokens, mask = torch.cat([tokens, next_token], 1), torch.cat([mask, torch.ones_like(next_token)], 1)
            step = model(next_token, mems=step.mems, attention_mask=mask)
    assert torch.equal(out, tokens)


# Every strategy docs/generation.md lists as working (transformers' core strategies; the others are Hub code).
STRATEGIES = {
    "greedy": {},
    "sampling": dict(do_sample=True, temperature=0.8, top_k=8, top_p=0.9, min_p=0.01, typical_p=0.95),
    "beam search": dict(num_beams=3, num_return_sequences=2, length_penalty=0.5, early_stopping=True),
    "beam sampling": dict(num_beams=3, do_sample=True),
    "logits processors": dict(repetition_penalty=1.5, no_repeat_ngram_size=2, bad_words_ids=[[7]], min_new_tokens=4),
    "scores": dict(return_dict_in_generate=True, output_scores=True, output_logits=True),
    "streamer": dict(streamer=TextStreamer(tiny_xlnet_tokenizer())),  # (any tokenizer: the tokens are only printed)
}
TXL_ONLY = {"prompt lookup": dict(prompt_lookup_num_tokens=2), "chunked prefill": dict(prefill_chunk_size=2)}


@pytest.mark.parametrize("kind", ["transfo-xl", "xlnet"])
@pytest.mark.parametrize("strategy", [*STRATEGIES, *TXL_ONLY, "assisted", "speculative sampling", "inputs_embeds"])
def test_each_listed_decoding_strategy(kind, strategy):
    if kind == "transfo-xl":
        model, small, ids = scrambled_lm(), scrambled_lm(seed=3, n_layer=1), prompt(batch=1)
    else:
        (_, model), (_, small), ids = scrambled_pair(mem_len=8), scrambled_pair(mem_len=8, n_layer=1), xlnet_ids(1, 5)
    settings = {**STRATEGIES, **TXL_ONLY}.get(strategy, {})
    if strategy in ("assisted", "speculative sampling"):
        settings = dict(assistant_model=small, do_sample=strategy == "speculative sampling")
    torch.manual_seed(0)
    if strategy == "inputs_embeds":
        run = lambda: model.generate(inputs_embeds=model.get_input_embeddings()(ids), max_new_tokens=5)  # noqa: E731
    else:
        run = lambda: model.generate(ids, max_new_tokens=5, **settings)  # noqa: E731
    if kind == "xlnet" and strategy not in STRATEGIES:  # the exceptions docs/generation.md lists for XLNet
        with pytest.raises(ValueError, match="not supported|without a cache|doesn't have its forwarding implemented"):
            run()
        return
    out = run()
    sequences = out.sequences if strategy == "scores" else out
    assert sequences.shape[1] == (5 if strategy == "inputs_embeds" else ids.shape[1] + 5)
    if strategy in ("prompt lookup", "chunked prefill", "assisted", "inputs_embeds"):  # greedy's tokens, exactly
        assert torch.equal(sequences[:, -5:], greedy(model, ids, max_new_tokens=5)[:, -5:])


# --------------------------------------------------------------------------------------------------------------
# Configuration and embeddings
# --------------------------------------------------------------------------------------------------------------


def small_from_hub_config(**overrides):
    """The wt103 config.json (no pad / bos ids in it), shrunk to a test size."""
    sizes = dict(n_layer=1, d_model=16, d_embed=64, n_head=2, d_head=8, d_inner=32, vocab_size=60, cutoffs=[10, 20, 40])
    return TransfoXLConfig.from_pretrained(ROOT / "hub_configs" / "transfo-xl-wt103", **sizes, **overrides)


def test_pad_and_bos_token_ids_default_to_none():
    config = small_from_hub_config()
    assert config.pad_token_id is None and config.bos_token_id is None and config.eos_token_id == 0
    classifier = TransfoXLForSequenceClassification(config).eval()
    assert classifier(torch.tensor([[3, 4, 5]])).logits.shape == (1, 2)
    model = TransfoXLLMHeadModel(config).eval()
    with pytest.raises(ValueError, match="`bos_token_id` has to be defined when no `input_ids` are provided"):
        model.generate(max_new_tokens=2)
    out = TransfoXLLMHeadModel(small_from_hub_config(bos_token_id=0)).eval().generate(max_new_tokens=2, do_sample=False)
    assert out.shape == (1, 3) and out[0, 0] == 0


def test_config_rejects_clusters_without_embedding_dimensions():
    with pytest.raises(ValueError, match=r"invalid `d_embed`=8; expected at least div_val\*\*2 = 16"):
        TransfoXLConfig(vocab_size=30, cutoffs=[10, 20], d_embed=8, div_val=4)
    TransfoXLConfig(vocab_size=30, cutoffs=[10, 20], d_embed=16, div_val=4)  # 16, 4, 1 dimensions


def train_on_new_token(model, new_id, steps=30):
    """A few SGD steps on sequences that use `new_id`; returns its mean log-probability after `new_id - 1`...
    before and after training."""
    ids = torch.tensor([[new_id - 1, new_id, 3, new_id - 1, new_id, 4]] * 2)

    def log_prob():
        with torch.no_grad():
            return model.eval()(ids).logits[:, [0, 3], new_id].mean().item()

    before = log_prob()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        model(ids, labels=ids).loss.backward()
        optimizer.step()
    return before, log_prob()


@pytest.mark.parametrize(
    "div_val, cutoffs, d_embed, tie_weight",
    [(2, [20, 50], 32, True), (1, [20, 50], 16, True), (1, [], 32, True), (2, [20, 50], 32, False)],
)
def test_transfo_xl_resize_grows_the_last_cluster(div_val, cutoffs, d_embed, tie_weight, tmp_path):
    torch.manual_seed(0)
    overrides = dict(div_val=div_val, cutoffs=cutoffs, d_embed=d_embed, tie_weight=tie_weight)
    config = TransfoXLConfig(**{**TINY_TXL, **overrides})
    model = TransfoXLLMHeadModel(config).eval()
    ids = torch.randint(0, 90, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
    parameters = dict(model.named_parameters())
    assert model.resize_token_embeddings(90) is model.get_input_embeddings()  # the same size: nothing changes
    assert dict(model.named_parameters()) == parameters

    embedding = model.resize_token_embeddings(93)
    assert embedding is model.get_input_embeddings() is model.transformer.word_emb
    model.set_input_embeddings(embedding)
    assert model.get_input_embeddings() is embedding
    assert model.config.vocab_size == 93 and model.config.cutoffs == cutoffs
    assert (model.crit.out_layers[-1].weight is embedding.emb_layers[-1].weight) == tie_weight  # tied as before
    assert model.crit.out_layers[-1].weight.shape == embedding.emb_layers[-1].weight.shape
    assert model.crit.out_layers[-1].bias.shape[0] == embedding.emb_layers[-1].weight.shape[0]
    with torch.no_grad():
        after = model(ids).logits
    assert after.shape == (2, 9, 93)
    torch.testing.assert_close(after.exp().sum(-1), torch.ones(2, 9))
    last = cutoffs[-1] if cutoffs else 0
    torch.testing.assert_close(after[..., :last], before[..., :last], rtol=0, atol=0)  # other clusters: unchanged
    # the last cluster is renormalised over its new ids: its old ids keep their ratios
    ratios = lambda logits: logits[..., last:90] - logits[..., last : last + 1]  # noqa: E731
    torch.testing.assert_close(ratios(after), ratios(before))

    model.save_pretrained(tmp_path)
    reloaded = TransfoXLLMHeadModel.from_pretrained(tmp_path).eval()
    assert reloaded.config.vocab_size == 93
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, after, rtol=0, atol=0)
    learned_before, learned_after = train_on_new_token(model, 92)
    assert learned_after > learned_before + 1.0


def test_transfo_xl_resize_shrinks_the_last_cluster_or_refuses():
    torch.manual_seed(0)
    model = TransfoXLLMHeadModel(TransfoXLConfig(**TINY_TXL)).eval()
    ids = torch.randint(0, 60, (2, 5))
    with torch.no_grad():
        before = model(ids).logits
    model.resize_token_embeddings(60)
    with torch.no_grad():
        after = model(ids).logits
    assert after.shape[-1] == 60 and model.crit.out_layers[-1].bias.shape == (10,)
    torch.testing.assert_close(after[..., :50], before[..., :50], rtol=0, atol=0)
    torch.testing.assert_close(after[..., 50:].exp().sum(-1), before[..., 50:90].exp().sum(-1))  # P(last cluster)
    with pytest.raises(ValueError, match=r"new_num_tokens=50; expected an integer above 50: resizing changes the last"):
        model.resize_token_embeddings(50)
    assert model.resize_token_embeddings(61, pad_to_multiple_of=8) is model.get_input_embeddings()
    assert model.config.vocab_size == 64


def test_transfo_xl_resize_base_model_classifier_and_sampled_softmax():
    base = TransfoXLModel(TransfoXLConfig(**TINY_TXL))
    base.resize_token_embeddings(95)
    assert base.word_emb.emb_layers[-1].num_embeddings == 45
    assert base(torch.tensor([[94]])).last_hidden_state.shape == (1, 1, 32)
    classifier = TransfoXLForSequenceClassification(TransfoXLConfig(**TINY_TXL))
    classifier.resize_token_embeddings(95)
    assert classifier(torch.tensor([[94, 3]])).logits.shape == (1, 2)
    sampled = TransfoXLLMHeadModel(TransfoXLConfig(**TINY_TXL, sample_softmax=8))
    sampled.resize_token_embeddings(95)
    assert sampled.out_bias.shape == (95,) and sampled.sampler.dist.shape == (95,)
    assert sampled.train()(torch.tensor([[94, 93, 3]]), labels=torch.tensor([[94, 93, 3]])).loss.isfinite()


def test_xlnet_resize_keeps_the_head_tied_with_its_bias(tmp_path):
    torch.manual_seed(0)
    model = XLNetLMHeadModel(XLNetConfig(vocab_size=40, d_model=32, n_head=4, d_inner=37, n_layer=2, dropout=0.0))
    model.eval()
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        before = model(ids).logits
    model.resize_token_embeddings(43)
    assert model.lm_loss.weight is model.get_input_embeddings().weight and model.lm_loss.bias.shape == (43,)
    assert model.get_output_embeddings() is model.lm_loss and model.config.vocab_size == 43
    with torch.no_grad():
        after = model(ids).logits
    torch.testing.assert_close(after[..., :40], before, rtol=0, atol=0)  # logits: old tokens unchanged
    model.save_pretrained(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(XLNetLMHeadModel.from_pretrained(tmp_path).eval()(ids).logits, after)
    new = torch.tensor([[41, 42, 41, 42, 41, 42]])  # XLNet's labels are not shifted: predict each position
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.no_grad():
        first = model(new).logits.log_softmax(-1)[0, torch.arange(6), new[0]].mean()
    for _ in range(20):
        optimizer.zero_grad()
        model.train()(new, labels=new).loss.backward()
        optimizer.step()
    with torch.no_grad():
        assert model.eval()(new).logits.log_softmax(-1)[0, torch.arange(6), new[0]].mean() > first + 1.0


# --------------------------------------------------------------------------------------------------------------
# Legacy code keeps working
# --------------------------------------------------------------------------------------------------------------


def test_prediction_scores_is_a_key_too():
    model = scrambled_lm()
    out = model(prompt())
    assert out["prediction_scores"] is out["logits"] is out.prediction_scores


@pytest.mark.parametrize("trainer_compatible", [False, True])
def test_tuples_follow_transformers_4_order(trainer_compatible):
    """transformers 4.37.2 `TransfoXLLMHeadModel.forward(return_dict=False)`: `(losses, (), mems, ..., loss)`, with
    `trainer_compatible` `(loss, (), losses, mems, ...)`, without labels `(prediction_scores, mems, ...)`."""
    model = scrambled_lm(trainer_compatible=trainer_compatible)
    ids = prompt()
    reference = model(ids, labels=ids, output_hidden_states=True)
    out = model(ids, labels=ids, output_hidden_states=True, return_dict=False)
    if trainer_compatible:
        loss, empty, losses, mems, hidden_states = out
    else:
        losses, empty, mems, hidden_states, loss = out
    assert empty == () and loss is not None and loss.dim() == 0
    torch.testing.assert_close(losses, reference.losses)
    assert len(mems) == len(hidden_states) - 1 == 2
    logits, mems = model(ids, return_dict=False)
    assert logits.shape == (2, 6, 90) and len(mems) == 2


def test_transfo_xl_forward_refuses_unknown_keywords():
    config = TransfoXLConfig(**TINY_TXL)
    ids = torch.tensor([[3, 4, 5]])
    for model in (TransfoXLModel(config), TransfoXLLMHeadModel(config), TransfoXLForSequenceClassification(config)):
        for keyword in ("bogus_kwarg", "zero_initial_mems"):
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
                model(ids, **{keyword: True})
    assert TransfoXLLMHeadModel(config)(ids, labels=ids, num_items_in_batch=4).loss.isfinite()


def test_trainer_passes_num_items_in_batch_to_the_lm_head_only(tmp_path):
    config = TransfoXLConfig(**TINY_TXL)
    args = TrainingArguments(str(tmp_path), report_to=[], use_cpu=True)
    assert Trainer(model=TransfoXLLMHeadModel(config), args=args).model_accepts_loss_kwargs
    # the classifier returns a mean (its loss ignores num_items_in_batch): Trainer scales it for accumulation
    assert not Trainer(model=TransfoXLForSequenceClassification(config), args=args).model_accepts_loss_kwargs


# --------------------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------------------


def test_from_corpus_on_raw_text_knows_every_word_of_its_corpus():
    corpus = TOKENIZER_FIXTURES / "corpus.txt"  # raw prose, numbers, punctuation; some WikiText lines with <unk>
    lines = corpus.read_text(encoding="utf-8").split("\n")
    literal_unknowns = sum(line.split().count("<unk>") for line in lines)

    def unknown_rate(tokenizer):
        encoded = [i for line in lines for i in tokenizer(line)["input_ids"]]
        return encoded.count(tokenizer.unk_token_id), len(encoded)

    raw = TransfoXLTokenizer.from_corpus(corpus)  # default specials: <eos> 0, <unk> 1
    assert raw.convert_ids_to_tokens([0, 1]) == ["<eos>", "<unk>"]
    unknowns, total = unknown_rate(raw)
    assert unknowns <= literal_unknowns and unknowns / total < 0.002  # only the text's own <unk> words
    split_on_spaces = TransfoXLTokenizer.from_corpus(corpus, tokenized=True)  # the original `Vocab` behaviour
    unknowns, total = unknown_rate(split_on_spaces)
    assert unknowns / total > 0.1
    lowered = TransfoXLTokenizer.from_corpus(corpus, lower_case=True, add_eos=True)
    assert all(not re.search("[A-Z]", word) for word in lowered.get_vocab() if not word.startswith("<"))
    assert lowered("Hello, World\n")["input_ids"][-1] == lowered.eos_token_id
