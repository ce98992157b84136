"""Comparing greedy decodings made by computations that round differently (cached or not, ours or transformers')."""

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
