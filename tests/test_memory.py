"""memory.py: the parameter count a memory check uses is the model's own, at any depth; the memory it says a
training step takes is what a process's peak rises by."""
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from conftest import ROOT, on_glibc
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


# Three AdamW steps of the plan's smallest model over a vocabulary of 16,384, in a process of its own: how far its
# memory rose above what it held before them (the peak reset first: /proc/self/clear_refs), and what training_bytes
# says a step needs less the parameters already there ("growth estimate"). argv: root, batch, "kept" or "glibc",
# the teachers it learns from (distill.Teachers, in float32: a CPU without bfloat16's products), and how many of each
# sequence's first targets are -1 (a chat dataset's prompt, which the loss skips)
STEPS = """
import re, sys, torch
from contextlib import nullcontext
sys.path.insert(0, sys.argv[1])
from model import GPT
from nanogpt.cpu.heap import keep_freed_memory
from nanogpt.memory import training_bytes
from nanogpt.training.distill import Teachers
from nanogpt.training.plan import LADDER
from nanogpt.training.train_config import TrainConfig
batch, kept, taught, prompt = int(sys.argv[2]), sys.argv[3] == "kept", int(sys.argv[4]), int(sys.argv[5])
if kept:
    assert keep_freed_memory()
config = TrainConfig(**{**LADDER["S0"], "block_size": 64, "batch_size": batch}).model_config(vocab_size=16384)
model = GPT(config)
teachers = Teachers([GPT(config).eval().requires_grad_(False) for _ in range(taught)], 0.8, nullcontext())
optimizer = torch.optim.AdamW(model.parameters())
x = torch.randint(16384, (batch, 64))
y = x.clone()
y[:, :prompt] = -1

def kb(name):
    return int(re.search(rf"{name}:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) * 1024

held = kb("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM := VmRSS
for _ in range(3):
    logits, loss = model(x, y)
    (teachers.loss(x, y, logits, loss) if taught else loss).backward()
    del logits, loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print(kb("VmHWM") - held,
      training_bytes(config, batch, kept, [config] * taught) - 4 * sum(p.numel() for p in model.parameters()))
"""


def growth_and_estimate(batch, heap, teachers=0, prompt=0):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "THP_"))}
    out = subprocess.run([sys.executable, "-c", STEPS, ROOT, str(batch), heap, str(teachers), str(prompt)],
                         capture_output=True, text=True, env=env, check=True)
    return [int(n) for n in out.stdout.split()]


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="a peak that resets (Linux)")
@pytest.mark.parametrize("heap", ["glibc", "kept"])
def test_training_bytes_holds_what_a_step_takes_over_a_large_vocabulary(heap):
    """36 sequences of 64 tokens over 16,384 tokens are 151 MB of logits a float32 copy: what three training steps
    add to a process is about what training_bytes says, logits included (left out, it said an eighth of it), and
    with freed blocks kept (heap.keep_freed_memory) twice as much again, which the kept count holds (counted as
    live, it said half)."""
    if heap == "kept" and not on_glibc():
        pytest.skip("glibc's malloc")
    grew, estimate = growth_and_estimate(36, heap)
    assert (0.5 if heap == "kept" else 0.6) < grew / estimate < 1.1  # the kept heap: 0.66 to 0.98 in 37 runs


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="a peak that resets (Linux)")
@pytest.mark.parametrize("prompt", [0, 1], ids=["text", "chat"])
def test_training_bytes_holds_what_a_step_that_learns_from_two_teachers_takes(prompt):
    """The same steps learning from two teachers (train.py --teacher): their predictions, their mean and the loss
    against it add 3 to 3.4 copies of the logits to a step, which training_bytes counts (left out, glibc's growth was
    1.55 times the estimate). On a chat dataset the loss keeps the positions whose target is not -1, copying the
    logits and the mean there, and scatters their gradient back: with one prompt token a sequence (the most it
    copies) a copy more, still counted. glibc's heap: the kept heap's count has more room."""
    grew, estimate = growth_and_estimate(36, "glibc", teachers=2, prompt=prompt)
    assert 0.6 < grew / estimate < 1.1


def test_off_a_cpu_the_teachers_weights_count_too(monkeypatch):
    """On a CPU a teacher's weights are in memory before the check (read from its file); on a GPU they go to the
    device after it, so there its float32 weights count as well (a 6 x 256 teacher of a 2 x 64 student: 4.7M
    parameters, 19 MB)."""
    import nanogpt.memory
    from nanogpt.errors import UserError
    from nanogpt.memory import training_bytes
    from nanogpt.training.plan import LADDER
    from nanogpt.training.startup import check_memory
    from nanogpt.training.train_config import TrainConfig
    student = TrainConfig(**LADDER["S0"]).model_config(vocab_size=64)
    teacher = TrainConfig(**LADDER["S4"]).model_config(vocab_size=64)
    need = training_bytes(student, 12, teachers=[teacher])
    monkeypatch.setattr(nanogpt.memory, "trim_freed_memory", lambda: False)  # glibc's heap, not kept
    monkeypatch.setattr(nanogpt.memory, "available_bytes", lambda device: need + 2 * param_count(teacher))
    check_memory(student, 12, torch.device("cpu"), teachers=[teacher], log=lambda *a: None)
    with pytest.raises(UserError, match="from one teacher on micro-batches of 12"):
        check_memory(student, 12, torch.device("cuda"), teachers=[teacher], log=lambda *a: None)
