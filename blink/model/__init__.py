"""The Llama-family model: config.py (ModelConfig), presets.py, rope.py, layers.py, llama.py (the decoder),
weights.py (load_model, HF-name loading), attention_metadata.py, demo.py (the default demo checkpoint).

Kept free of imports so that light users (e.g. the front end calling demo.ensure_default_model) do not
pull in the kernels.
"""
