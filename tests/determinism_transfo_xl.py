"""Run by test_determinism_transfo_xl.py in fresh processes: prints one hash of the bytes of a Transformer-XL's
training step (loss, losses, every gradient), evaluation logits and greedy generate() scores, fp32 and bf16, once
as torch runs by default and once under `torch.use_deterministic_algorithms(True)`."""

import hashlib

import torch

from transformers_xl import TransfoXLConfig, TransfoXLLMHeadModel


def digest(deterministic: bool) -> str:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(deterministic)
    hashed = hashlib.sha256()

    def add(tensor):
        hashed.update(tensor.detach().reshape(-1).view(torch.uint8).numpy().tobytes())

    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        config = TransfoXLConfig(vocab_size=300, cutoffs=[100, 200], d_model=64, d_embed=64, n_head=4, d_head=16,
                                 d_inner=128, div_val=2, n_layer=2, mem_len=16, tgt_len=16, dropout=0.1, dropatt=0.1)
        model = TransfoXLLMHeadModel(config).to(dtype).train()
        ids = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))
        mems = model(ids).mems
        out = model(ids, mems=mems, labels=ids)
        out.loss.backward()
        for tensor in (out.loss, out.losses, *(p.grad for p in model.parameters() if p.grad is not None)):
            add(tensor)
        model.eval()
        with torch.no_grad():
            add(model(ids, mems=mems).logits)
            generated = model.generate(ids[:, :5], attention_mask=torch.ones(2, 5, dtype=torch.long), max_new_tokens=6,
                                       do_sample=False, output_scores=True,
                                       return_dict_in_generate=True, pad_token_id=0)
        for scores in generated.scores:
            add(scores)
    return hashed.hexdigest()


if __name__ == "__main__":
    print(digest(False), digest(True))
