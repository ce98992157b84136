"""Training with the memory carried across steps (Transformer-XL streams, XLNet permutation LM) and the demo."""
