"""Comparing greedy and beam decodings of computations that round differently (cached or not, ours or theirs)."""

import torch


def assert_greedy_decodings_agree(sequences, logits, expected_sequences, expected_logits, atol, rtol=0.0):
    """Each row's tokens equal the expected ones, and each step's logits (one [rows, vocab] tensor per step) are
    close to the expected, up to the row's first step whose tokens differ. There the logits must still be close and
    the two tokens a near tie (each decoding scores them within twice the tolerance), which rounding on another CPU
    may order either way; after it each decoding continues its own text and is not compared. (Bitwise equal tokens
    would fail on such a tie.)"""
    assert sequences.shape == expected_sequences.shape and len(logits) == len(expected_logits)
    prompt_length = sequences.shape[1] - len(logits)
    assert torch.equal(sequences[:, :prompt_length], expected_sequences[:, :prompt_length])
    for row in range(sequences.shape[0]):
        for step, (scores, expected_scores) in enumerate(zip(logits, expected_logits)):
            message = f"row {row}, step {step}"
            torch.testing.assert_close(scores[row], expected_scores[row], atol=atol, rtol=rtol, msg=message)
            token, expected_token = sequences[row, prompt_length + step], expected_sequences[row, prompt_length + step]
            if token != expected_token:
                for row_scores in (scores[row], expected_scores[row]):
                    gap = (row_scores[token] - row_scores[expected_token]).abs().item()
                    tolerance = 2 * (atol + rtol * row_scores.abs().max().item())
                    assert gap <= tolerance, f"row {row}, step {step}: tokens {token}, {expected_token} {gap:.3g} apart"
                break


class ForcedTokens:
    """A logits processor that makes every row take its given next token (`tokens` [rows, steps]): a greedy
    decoding then returns the model's logits along those sequences."""

    def __init__(self, tokens):
        self.tokens, self.step = tokens, 0

    def __call__(self, input_ids, scores):
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, self.tokens[:, self.step, None], 0.0)
        self.step += 1
        return forced


def sequence_log_probs(model, sequences, new_tokens, **settings):
    """Each row's summed log-probability of its last `new_tokens` tokens under `model`'s generate() (same settings,
    greedy, the tokens forced)."""
    prompt, tokens = sequences[:, :-new_tokens], sequences[:, -new_tokens:]
    settings = {key: value for key, value in settings.items() if key not in ("num_beams", "num_return_sequences")}
    out = model.generate(prompt, **settings, max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True,
                         output_logits=True, logits_processor=[ForcedTokens(tokens)])  # fmt: skip
    log_probs = torch.stack(out.logits, 1).float().log_softmax(-1)
    return log_probs.gather(-1, tokens[..., None]).squeeze(-1).sum(1)


def assert_beam_searches_agree(model, reference, prompt, new_tokens, atol, **settings):
    """Beam search: each returned sequence equals the reference's, or the two are a tie, which rounding on another
    CPU may order either way: the reference model scores both alike (up to `atol` per step). The final beam scores
    must be close either way. (With a short memory, sequences made of the same transitions in another order have
    the same score, and the last bit of a sum picks one.)"""
    generated = dict(settings, max_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
    generated.update(output_scores=True)  # (sequences_scores)
    actual, expected = model.generate(prompt, **generated), reference.generate(prompt, **generated)
    torch.testing.assert_close(actual.sequences_scores, expected.sequences_scores, atol=atol, rtol=0)
    differing = (actual.sequences != expected.sequences).any(1)
    if differing.any():
        ours, theirs = (
            sequence_log_probs(reference, out.sequences[differing], new_tokens, **settings)
            for out in (actual, expected)
        )
        torch.testing.assert_close(ours, theirs, atol=2 * atol * new_tokens, rtol=0, msg="not a tie")
