"""The tiny model built locally (random weights, a tokenizer trained on local text) and checkpoint conversion."""
