"""The library under the programs: everything train.py, sample.py, serve.py and the other programs at the
repository's top share. The course's model (model.py) and the config parser's entrance (configurator.py, over
nanogpt/settings.py) stay at the top, beside the programs; of the top's files the package imports only model.py.

Where nanoGPT's names went: `GPT.from_pretrained("gpt2")` is `nanogpt.interop.hf.from_pretrained("gpt2")`, and the
fast generation loop (KV cache, top-p, stops) is `nanogpt.generate.generate(model, idx, ...)`;
`model.generate(...)` is nanoGPT's plain loop, unchanged.
"""
import os

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout: programs, config/, data/
