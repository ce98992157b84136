"""The language-model heads' losses equal the cross-entropy of their full log-probabilities / logits, in values
and gradients (fp64, exact to rounding): Transformer-XL's adaptive NLL (each tail cluster scored over its own rows)
and XLNet's loss."""

import pytest
import torch
import torch.nn.functional as F

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel
from transformers_xl.modeling.configuration_xlnet import XLNetConfig
from transformers_xl.modeling.modeling_xlnet import XLNetLMHeadModel


def loss_and_gradients(model, input_ids, **kwargs):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids, labels=input_ids, **kwargs).loss
    loss.backward()
    return [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("div_val", [1, 2])
def test_transfo_xl_adaptive_loss_equals_the_full_log_probabilities(div_val):
    """The adaptive NLL (a cross-entropy per cluster, over its rows) against -log_prob of the whole vocabulary, in fp64."""
    config = TransfoXLConfig(vocab_size=40, d_model=8, d_embed=8, n_head=2, d_head=4, d_inner=16, n_layer=2,
                             mem_len=4, cutoffs=[10, 25], div_val=div_val, dropout=0.0, dropatt=0.0)  # fmt: skip
    model = TransfoXLLMHeadModel(config).double().train()
    input_ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    input_ids[1, 3] = 39  # (the last cluster's last word)
    got = loss_and_gradients(model, input_ids)

    def full_softmax_loss(hidden, labels):
        log_p = model.crit.log_prob(hidden[:, :-1].reshape(-1, hidden.shape[-1]))
        return -log_p.gather(1, labels[:, 1:].reshape(-1, 1)).mean()

    model.zero_grad(set_to_none=True)
    hidden = model.transformer(input_ids).last_hidden_state
    loss = full_softmax_loss(hidden, input_ids)
    loss.backward()
    want = [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)


def test_xlnet_language_model_loss_equals_cross_entropy_of_its_logits():
    config = XLNetConfig(vocab_size=30, d_model=8, n_layer=2, n_head=2, d_inner=16, dropout=0.0)
    model = XLNetLMHeadModel(config).double().train()
    input_ids = torch.randint(0, 30, (2, 7), generator=torch.Generator().manual_seed(2))
    labels = input_ids.clone()
    labels[0, 2] = -100
    model.zero_grad(set_to_none=True)
    out = model(input_ids, labels=labels)
    out.loss.backward()
    got = [out.loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    logits = model(input_ids).logits
    loss = F.cross_entropy(logits.reshape(-1, 30), labels.reshape(-1))
    loss.backward()
    want = [loss] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
