"""memory.py: the parameter count a memory check uses is the model's own, at any depth."""
from dataclasses import replace

import pytest

from model import GPT
from nanogpt.memory import param_count

OPTIONS = [dict(), dict(bias=False), dict(tie_weights=False), dict(n_kv_head=2), dict(n_kv_head=1, mlp_hidden=40),
           dict(activation="swiglu", norm="rmsnorm"), dict(pos_emb="rope", qk_norm=True),
           dict(value_embeds=1, pos_emb="rope"), dict(value_embeds=2, n_layer=4, tie_weights=False, bias=False),
           dict(value_embeds=2, n_layer=7, n_kv_head=2), dict(n_layer=1), dict(n_layer=5, logit_softcap=15.0)]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "gpt2")
def test_param_count_is_the_real_models_each_shared_weight_once(tiny_config, options):
    model = GPT(replace(tiny_config, **options))
    tensors = {p.data_ptr(): p.numel() for _, p in model.named_parameters(remove_duplicate=False)}  # a tied head once
    assert param_count(model.config) == sum(tensors.values())
