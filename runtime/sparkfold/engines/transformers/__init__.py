"""The ``transformers`` engine: a Hugging Face causal LM on CPU, one or two ranks.

``backend`` loads and serves it, ``tensor_parallel`` splits its MLPs across two ranks,
``sampling`` picks each next token.
"""
