"""The CUDA path: attention paths, bf16 autocast training, fused AdamW, cached decoding. Skipped without a GPU."""
from dataclasses import replace

import pytest
import torch

from conftest import optimizer_settings
from model import GPT, CausalSelfAttention
from nanogpt.generate import generate
from nanogpt.training.optim import configure_optimizers

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_attention_paths_agree_on_cuda(tiny_config):
    torch.manual_seed(0)
    sdpa = CausalSelfAttention(replace(tiny_config, attn_impl="sdpa")).cuda()
    manual = CausalSelfAttention(replace(tiny_config, attn_impl="manual")).cuda()
    manual.load_state_dict(sdpa.state_dict())
    x = torch.randn(3, 16, tiny_config.n_embd, device="cuda")
    torch.testing.assert_close(sdpa(x), manual(x), atol=1e-5, rtol=1e-5)


def test_bf16_autocast_step_with_fused_adamw_lowers_the_loss(tiny_config):
    torch.manual_seed(0)
    model = GPT(tiny_config).cuda()
    opt = configure_optimizers(model, optimizer_settings(learning_rate=3e-3))
    assert opt.defaults["fused"]
    x = torch.randint(0, 64, (4, 16), device="cuda")
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_cached_generation_matches_uncached_on_cuda(tiny_config):
    torch.manual_seed(0)
    model = GPT(replace(tiny_config, pos_emb="rope", n_kv_head=2)).cuda().eval()
    idx = torch.randint(0, 64, (2, 3), device="cuda")
    torch.testing.assert_close(generate(model, idx, 12, temperature=0),
                               generate(model, idx, 12, temperature=0, use_cache=False))
