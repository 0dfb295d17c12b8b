"""What the model computes, recorded where it computes it: standard forward hooks on a layer's modules and
the model's observation points (model.HookPoint). trace.py prints and draws what a Recorder holds; serve.py's
/v1/attention answers with its attention weights."""


class Recorder:
    """Standard forward hooks on one layer's modules and observation points (model.HookPoint):
    records, by stage name, what the model itself computes. Nothing is patched or recomputed."""

    def __init__(self, model, layer):
        self.model, self.layer, self.stages, self.handles = model, layer, {}, []

    def put(self, name, tensor):
        self.stages[name] = tensor.detach().clone()

    def hook(self, module, name, pre=False):
        if pre:
            self.handles.append(module.register_forward_pre_hook(lambda m, args: self.put(name, args[0])))
        else:
            self.handles.append(module.register_forward_hook(lambda m, args, out: self.put(name, out)))

    def __enter__(self):
        m, block = self.model, self.model.transformer.h[self.layer]
        attn = block.attn
        self.hook(m.transformer.wte, "embedding")
        if "wpe" in m.transformer:
            self.hook(m.transformer.wpe, "position embedding")
        self.hook(block, "block input", pre=True)
        self.hook(block.ln_1, "ln_1 (normed input)")
        self.hook(attn.c_attn, "c_attn (q | k | v)")
        rope = m.config.pos_emb == "rope"
        for point, name in ((attn.hook_q, "q before RoPE" if rope else "q"), (attn.hook_k, "k before RoPE" if rope else "k"),
                            (attn.hook_v, "v"), (attn.hook_scores, "scores (q.k / sqrt(hs))"),
                            (attn.hook_masked, "masked scores"), (attn.hook_weights, "attention weights"),
                            (attn.hook_heads, "head outputs")):
            self.hook(point, name)
        if rope:  # attention reads q and k after the rotation
            for point, names in ((attn.hook_q_rot, ("q after RoPE", "q")), (attn.hook_k_rot, ("k after RoPE", "k"))):
                for name in names:
                    self.hook(point, name)
        self.hook(attn.c_proj, "merged heads", pre=True)
        self.hook(attn.c_proj, "attention projection")
        self.hook(block.ln_2, "residual 1 (input + attention)", pre=True)
        self.hook(block.ln_2, "ln_2")
        self.hook(block.mlp.c_proj, "MLP hidden activations", pre=True)
        self.hook(block.mlp, "MLP output")
        self.hook(block, "residual 2 (block output)")
        self.hook(m.transformer.ln_f, "final norm")
        self.impls = [b.attn.impl for b in m.transformer.h]
        for b in m.transformer.h:  # the manual path materializes scores and weights
            b.attn.impl = "manual"
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        for b, impl in zip(self.model.transformer.h, self.impls):
            b.attn.impl = impl
