"""Follow a prompt through the model, stage by stage, then watch generation pick tokens.

    python trace.py --out_dir=out-shakespeare-char --start="Cats sit on"
    python trace.py --out_dir=OUT --start="Cats sit on" --layer=1 --head=0 --steps=2 --top=5 --html=trace.html

Runs the real model.py: standard forward hooks on its modules and observation
points (HookPoint) record what it computes (embedding, norm, q/k/v, RoPE,
scores, mask, softmax, head outputs, merge, projection, residuals, MLP, final
norm, head), and the sampler reports each generation step; nothing is patched
or recomputed here. With --copies=True each step also says how long a run of
training text the chosen token extends (docs/copies.md). Prints tables, and
writes the same data as JSON (--json) and as one self-contained HTML page with
attention heatmaps (--html).
"""
from nanogpt import program

program.exit_quietly_on_ctrl_c()  # before the slow imports (torch): Ctrl-C during them exits quietly

# ruff: noqa: E402
import html
import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from configurator import parse_args, report_overrides
from nanogpt.copies import min_chars, training_of
from nanogpt.device import Device, resolve_device
from nanogpt.errors import UserError
from nanogpt.files import open_to_write
from nanogpt.generate import Sampling, generate
from nanogpt.program import run_main
from nanogpt.source import Source, load_trained
from nanogpt.tracing import Recorder


@dataclass
class TraceConfig(Source, Sampling, Device):
    start: str = "Cats sit on"  # the prompt to follow through the model
    layer: int | None = None  # the layer to trace; None: every layer
    head: int | None = None  # the head to show; None: every head
    steps: int = 2  # generation steps to trace
    top: int = 5  # candidates shown per step, and next-token logits shown
    channels: int = 8  # columns printed per matrix on the console (JSON and HTML hold all)
    precision: int = 4
    device: str = "cpu"  # not auto: a trace is a few forwards of one prompt, which need no GPU
    json: str | None = None  # also write the whole trace as JSON here (a bare name goes into out_dir)
    html: str | None = None  # also write a page with attention heatmaps here (a bare name goes into out_dir)
    copies: bool = False  # each generation step: the run of training text the chosen token extends

    def __post_init__(self):
        Source.__post_init__(self)
        Sampling.__post_init__(self)
        for name, low in (("steps", 0), ("top", 1), ("channels", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not 0 <= self.precision <= 17:  # digits beyond what a float64 holds show nothing
            raise ValueError(f"precision must be in [0, 17] (digits after the point), got {self.precision}")


def tensor_data(t):
    """Nested lists with -inf as the string "-inf" (JSON has no infinities)."""
    values = t.detach().float().cpu().tolist()

    def fix(v):
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v if math.isfinite(v) else ("-inf" if v < 0 else "inf" if v > 0 else "nan")
    return fix(values)


def trace_forward(model, idx, layer):
    """Run the model once on idx (1, T), recording layer `layer`; returns (stages, logits)."""
    with Recorder(model, layer) as rec, torch.no_grad():
        logits, _ = model(idx)
    stages = dict(rec.stages)
    stages["ids"] = idx
    stages["logits"] = logits
    return stages


def trace_generation(model, idx, cfg, decode):
    """Generate cfg.steps tokens as sample.py would; the sampler reports each step (generate.stream's on_step)."""
    steps = []
    generator = torch.Generator(device=idx.device).manual_seed(cfg.seed)
    out = generate(model, idx, cfg.steps, generator=generator, on_step=steps.append, **cfg.settings())
    history = idx[0].tolist()
    report = []
    for i, step in enumerate(steps):
        probs, logits, token = step["probs"][0], step["logits"][0].float(), step["tokens"][0].item()
        kept = torch.nonzero(probs > 0).flatten()
        order = kept[probs[kept].argsort(descending=True)][:cfg.top]
        report.append({
            "step": i + 1, "history": decode(history), "candidates_kept": int(kept.numel()),
            "candidates": [{"id": int(t), "token": decode([int(t)]), "logit": logits[t].item(),
                            "prob": probs[t].item()} for t in order],
            "draw": step["draws"][0, 0].item() if step["draws"] is not None else None,
            "greedy": step["temperature"] == 0, "chosen": {"id": token, "token": decode([token])}})
        history.append(token)
    return report, out[0, idx.size(1):].tolist()


def copy_steps(training, tokenizer, ids, generated):
    """For each generated token, {"length", "copied"}: the characters of the longest run of text ending with it
    that the training text holds verbatim, and whether that run is long enough to count as copied (min_chars)."""
    text = tokenizer.decode(ids + generated)
    running = training.running(text)
    out = []
    for i in range(len(generated)):
        end = len(tokenizer.decode(ids + generated[:i + 1]))
        length = int(running[end])
        out.append({"length": length, "copied": length > 0 and length >= min_chars(text[end - length:end])})
    return out


def heads_view(t, n_head):
    """(1, H, T, D) per head, from (1, T, C) laid out as channel c = h*D + r."""
    B, T, C = t.shape
    return t.view(B, T, n_head, C // n_head).transpose(1, 2)


def build_trace(model, tokenizer, cfg, device, training=None):
    """What the model computes for cfg.start, stage by stage, and cfg.steps generation steps; training (a
    nanogpt.copies.Training, or None): each step also says what run of training text its token extends."""
    c = model.config
    fitted = tokenizer.fit(cfg.start)  # text outside the vocabulary, as sample.py: docs/generation.md
    if fitted.note():
        print(fitted.note("the prompt"), file=sys.stderr)
    ids = tokenizer.encode(fitted.text)
    if not ids:
        raise UserError("the prompt is empty; give some text with --start")
    if len(ids) > c.block_size:
        raise UserError(f"the prompt has {len(ids)} tokens, more than block_size ({c.block_size}); shorten it")
    for name, value, limit in (("layer", cfg.layer, c.n_layer), ("head", cfg.head, c.n_head)):
        if value is not None and not 0 <= value < limit:
            raise UserError(f"--{name}={value} is out of range: the model has {limit} {name}s (0 to {limit - 1})")
    idx = torch.tensor([ids], device=device)
    decode = tokenizer.decode
    layers = range(c.n_layer) if cfg.layer is None else [cfg.layer]
    heads = list(range(c.n_head)) if cfg.head is None else [cfg.head]
    result = {"prompt": fitted.text, "tokens": [decode([i]) for i in ids], "ids": ids,
              "model": asdict(c), "heads": heads, "layers": []}
    logits = None
    for layer in layers:
        stages = trace_forward(model, idx, layer)
        logits = stages.pop("logits")
        result["layers"].append(layer_report(stages, layer, heads, c))
        result["final norm"] = {"shape": list(stages["final norm"].shape), "values": tensor_data(stages["final norm"][0])}
    probs = F.softmax(logits[0, -1].float(), dim=-1)
    top = torch.topk(probs, min(cfg.top, probs.numel()))
    result["logits"] = logits
    result["next token"] = [{"id": int(i), "token": decode([int(i)]), "logit": logits[0, -1, i].item(), "prob": p.item()}
                            for p, i in zip(top.values, top.indices)]
    result["generation"], result["generated"] = trace_generation(model, idx, cfg, decode)
    if training is not None:
        for step, copy in zip(result["generation"], copy_steps(training, tokenizer, ids, result["generated"])):
            step["copy"] = copy
    return result


def layer_report(stages, layer, heads, c):
    """Shapes and values of every stage of one layer; per-head tensors limited to the shown heads."""
    per_head = {"q before RoPE", "k before RoPE", "q after RoPE", "k after RoPE", "q", "k", "v", "head outputs",
                "scores (q.k / sqrt(hs))", "masked scores", "attention weights"}
    kv_heads = {"k before RoPE", "k after RoPE", "k", "v"}
    out = {"layer": layer, "stages": []}
    order = ["ids", "embedding", "position embedding", "block input", "ln_1 (normed input)", "c_attn (q | k | v)",
             "q before RoPE", "k before RoPE", "q after RoPE", "k after RoPE", "q", "k", "v",
             "scores (q.k / sqrt(hs))", "masked scores", "attention weights", "head outputs", "merged heads",
             "attention projection", "residual 1 (input + attention)", "ln_2", "MLP hidden activations", "MLP output",
             "residual 2 (block output)"]
    for name in order:
        if name not in stages:
            continue
        t = stages[name]
        entry = {"name": name, "shape": list(t.shape)}
        if name in per_head:
            shown = [h // (c.n_head // c.kv_heads) for h in heads] if name in kv_heads else heads
            entry["heads"] = shown
            entry["values"] = [tensor_data(t[0, h]) for h in shown]
        elif name == "ids":
            entry["values"] = t[0].tolist()
        else:  # (1, T, C) stages, and wpe's (T, C)
            entry["values"] = tensor_data(t[0] if t.dim() == 3 else t)
        if name == "merged heads":
            D = c.head_dim
            entry["channel_map"] = [{"channel": ch, "head": ch // D, "r": ch % D} for ch in range(c.n_embd)]
            entry["per_head_view_equals_head_outputs"] = bool(torch.allclose(
                heads_view(t, c.n_head), stages["head outputs"], atol=1e-6))
        out["stages"].append(entry)
    return out


def fmt(v, p):
    if isinstance(v, str):
        return v
    return f"{v:.{p}f}"


def print_matrix(rows, labels, cfg, out):
    width = cfg.precision + 4
    for label, row in zip(labels, rows):
        row = row if isinstance(row, list) else [row]
        shown = " ".join(f"{fmt(v, cfg.precision):>{width}}" for v in row[:cfg.channels])
        more = f" ... ({len(row)} cols)" if len(row) > cfg.channels else ""
        out(f"  {label!r:>14} {shown}{more}")


def print_trace(result, cfg, out=print):
    tokens = result["tokens"]
    out(f"prompt {result['prompt']!r}: {len(tokens)} tokens {tokens}")
    for layer in result["layers"]:
        out(f"\n=== layer {layer['layer']} ===")
        for stage in layer["stages"]:
            out(f"\n{stage['name']}  shape {tuple(stage['shape'])}")
            if stage["name"] == "ids":
                out(f"  {stage['values']}")
            elif "heads" in stage:
                for h, values in zip(stage["heads"], stage["values"]):
                    out(f" head {h}:")
                    print_matrix(values, tokens, cfg, out)
            else:
                print_matrix(stage["values"], tokens, cfg, out)
            if "channel_map" in stage:
                D = len(stage["channel_map"]) // result["model"]["n_head"]
                out(f"  channel c = h*{D} + r: channels 0-{D - 1} are head 0, {D}-{2 * D - 1} head 1, ...; "
                    f"split back into heads they equal the head outputs: {stage['per_head_view_equals_head_outputs']}")
    out("\nnext token after the prompt:")
    for cand in result["next token"]:
        out(f"  {cand['token']!r:>10}  logit {cand['logit']:.{cfg.precision}f}  p {cand['prob']:.{cfg.precision}f}")
    out(f"\ngeneration ({'greedy' if cfg.temperature == 0 else f'temperature {cfg.temperature}, top_k {cfg.top_k}, top_p {cfg.top_p}'}):")
    for step in result["generation"]:
        out(f" step {step['step']}: history {step['history']!r}; {step['candidates_kept']} candidates kept")
        for cand in step["candidates"]:
            out(f"  {cand['token']!r:>10}  p {cand['prob']:.{cfg.precision}f}")
        how = "argmax" if step["greedy"] else f"draw u = {step['draw']:.{cfg.precision}f}"
        out(f"  {how} -> {step['chosen']['token']!r}{copy_note(step)}")


def copy_note(step):
    """How far the step's token extends a run of training text (--copies=True), else nothing."""
    copy = step.get("copy")
    if copy is None or not copy["length"]:
        return "" if copy is None else "  (no run of training text ends here)"
    return (f"  ({'extends a copied span' if copy['copied'] else 'a run of training text, too short to count'}: "
            f"{copy['length']} character{'s' * (copy['length'] != 1)} so far)")


HTML_STYLE = """body{font-family:sans-serif;margin:2em;max-width:70em}table.heatmap{border-collapse:collapse;margin:.5em 0 1.5em}
.heatmap td,.heatmap th{width:3.2em;height:1.6em;text-align:center;font-size:11px;border:1px solid #ddd}
.heatmap th{background:#f4f4f4;font-weight:normal}td.inf{background:#eee;color:#999}
.heatmap.raw,.heatmap.masked{display:none}body.view-raw .heatmap.raw,body.view-masked .heatmap.masked{display:table}
body.view-raw .heatmap.weights,body.view-masked .heatmap.weights{display:none}"""
HTML_SCRIPT = "function show(r){document.body.className='view-'+r.value}"
VIEWS = (("weights", "attention weights (each row sums to 1; zero above the diagonal)"),
         ("raw", "scores q.k/sqrt(hs), before the causal mask"),
         ("masked", "scores after the causal mask (-inf above the diagonal), as the softmax sees them"))


def visible(token):
    """A token as a heatmap label: spaces and newlines made visible."""
    return html.escape(token.replace(" ", "\u2423").replace("\n", "\u21b5"))


def heat_table(matrix, tokens, cls, precision):
    cells = ["<tr><th></th>" + "".join(f"<th>{visible(t)}</th>" for t in tokens) + "</tr>"]
    finite = [v for row in matrix for v in row if not isinstance(v, str)]
    hi = max(finite) if finite else 1.0
    lo = min(finite) if finite else 0.0
    for token, row in zip(tokens, matrix):
        tds = []
        for v in row:
            if isinstance(v, str):
                tds.append(f'<td class="inf">{v}</td>')
            else:
                a = (v - lo) / (hi - lo) if hi > lo else 0.0
                tds.append(f'<td style="background:rgba(200,60,20,{a:.3f})">{v:.{precision}f}</td>')
        cells.append(f"<tr><th>{visible(token)}</th>{''.join(tds)}</tr>")
    return f'<table class="heatmap {cls}">{"".join(cells)}</table>'


def render_html(result, cfg):
    tokens = result["tokens"]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>trace: {html.escape(result['prompt'])}</title>"
             f"<style>{HTML_STYLE}</style><script>{HTML_SCRIPT}</script></head><body>",
             f"<h1>{html.escape(result['prompt'])}</h1><p>{len(tokens)} tokens: "
             + " ".join(f"<code>{html.escape(repr(t))}</code>" for t in tokens) + "</p>",
             "<p>" + " ".join(f"<label><input type='radio' name='view' value='{v}' onchange='show(this)'"
                              f"{' checked' if v == 'weights' else ''}> {text}</label><br>" for v, text in VIEWS) + "</p>"]
    for layer in result["layers"]:
        stages = {s["name"]: s for s in layer["stages"]}
        weights, raw, masked = (stages[n] for n in ("attention weights", "scores (q.k / sqrt(hs))", "masked scores"))
        for i, h in enumerate(weights["heads"]):
            parts.append(f"<h2>layer {layer['layer']}, head {h}</h2>")
            for cls, stage in (("weights", weights), ("raw", raw), ("masked", masked)):
                parts.append(heat_table(stage["values"][i], tokens, cls, cfg.precision))
    parts.append("<h2>next token</h2><ol>" + "".join(
        f"<li><code>{html.escape(repr(c['token']))}</code> p={c['prob']:.{cfg.precision}f}</li>"
        for c in result["next token"]) + "</ol><h2>generation</h2>")
    for step in result["generation"]:
        how = "argmax" if step["greedy"] else f"draw u = {step['draw']:.{cfg.precision}f}"
        cands = "".join(f"<tr><td><code>{html.escape(repr(c['token']))}</code></td><td>{c['prob']:.{cfg.precision}f}"
                        f"</td></tr>" for c in step["candidates"])
        parts.append(f"<h3>step {step['step']}</h3><p>history: <code>{html.escape(step['history'])}</code></p>"
                     f"<table class='steps'>{cands}</table><p>{how} &rarr; <code>"
                     f"{html.escape(repr(step['chosen']['token']))}</code>{html.escape(copy_note(step))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def main(argv):
    cfg, overrides = parse_args(TraceConfig, argv)
    report_overrides(overrides, TraceConfig(), log=lambda line: print(line, file=sys.stderr))
    device = resolve_device(cfg.device)
    model, tokenizer, dataset = load_trained(cfg, device)
    result = build_trace(model, tokenizer, cfg, device, training_of(dataset, cfg.path) if cfg.copies else None)
    result.pop("logits")
    print_trace(result, cfg)
    if cfg.json:
        path = output_path(cfg.json, cfg)
        with open_to_write(path) as f:  # never through a link planted in out_dir
            json.dump(result, f)
        print(f"\nwrote {os.path.abspath(path)}")
    if cfg.html:
        path = output_path(cfg.html, cfg)
        with open_to_write(path) as f:
            f.write(render_html(result, cfg))
        print(f"\nwrote {os.path.abspath(path)}")


def output_path(path, cfg):
    """A bare file name goes beside the checkpoint, in out_dir (as train.py's outputs do); a path as given."""
    if cfg.init_from == "resume" and not os.path.dirname(path):
        return os.path.join(cfg.out_dir, path)
    return path


if __name__ == "__main__":
    run_main(main)
