"""A prompt as routing sees it: rendered with the model's template,
tokenized, cut into KV blocks and chain-hashed, with the memos that keep a warm
prefix cheap and the bounds on what one request may cost.

Imports ``engine`` (the tokenizer) and ``policies`` (hashing); no request path.
"""
