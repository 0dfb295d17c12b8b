#!/usr/bin/env bash
# The behaviour of the checkout in the current directory, as text that two checkouts can diff: a refactor
# that promises "behaviour unchanged" must leave all three files byte for byte the same.
# Runs from a repository's root with that checkout's programs (this file may live in another checkout),
# offline, on CPU, one thread; writes only under OUT_DIR (which must be new or empty). 2-6 minutes on 2 cores.
#
#   bash runs/fingerprint.sh /tmp/fp-before            # in the checkout before the change
#   bash /path/to/runs/fingerprint.sh /tmp/fp-after    # in the checkout after it
#   diff -r /tmp/fp-before /tmp/fp-after -x logs -x data -x 'out-*'   # hashes.txt, losses.txt, texts.txt
#
# OUT_DIR/hashes.txt: "run key sha256" for every tensor of each run's ckpt.pt (model, optimizer state)
# OUT_DIR/losses.txt: each run's log.jsonl records without their timing fields
# OUT_DIR/texts.txt:  seeded sample.py, chat.py, trace.py and serve.py texts, timings masked
# Corpora come from ../shared/data (SHARED=DIR to read another copy); each command's output is in OUT_DIR/logs.
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"

case "${1:-}" in
    -h|--help) sed -n '2,14p' "$self"; exit 0 ;;
    ""|-*) echo "runs/fingerprint.sh: give an output directory (try --help)" >&2; exit 2 ;;
esac
[ $# -eq 1 ] || { echo "runs/fingerprint.sh: one output directory, got $# arguments (try --help)" >&2; exit 2; }
[ -f train.py ] && [ -d nanogpt ] || {
    echo "runs/fingerprint.sh: run it from a repository's root (no train.py and nanogpt/ in $PWD)" >&2; exit 2; }
shared="$(cd "${SHARED:-../shared}" 2>/dev/null && pwd)" || {
    echo "runs/fingerprint.sh: ${SHARED:-../shared} not found; set SHARED=DIR to the shared files" >&2; exit 2; }
mkdir -p "$1"
out="$(cd "$1" && pwd)"
repo="$(pwd -P)"
case "$(cd "$out" && pwd -P)/" in "$repo"/*)
    echo "runs/fingerprint.sh: $out is inside the checkout; give a directory outside it" >&2; exit 2 ;; esac
[ -z "$(ls -A "$out")" ] || {
    echo "runs/fingerprint.sh: $out is not empty; give a new directory (a run into an old one would resume)" >&2
    exit 2; }

# the same threads and no caches or bytecode written into the checkout: bit-reproducible, and the checkout untouched
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1
export TIKTOKEN_CACHE_DIR="$shared/tiktoken_cache" TOKENIZERS_PARALLELISM=false CUDA_VISIBLE_DEVICES=""
export WANDB_MODE=disabled
data="$out/data" logs="$out/logs"
mkdir -p "$data" "$logs"
t0=$SECONDS

# step NAME COMMAND...: run it with its output in logs/NAME.{out,err}; on failure show the end of both
step() {
    local name="$1"; shift
    echo "[$((SECONDS - t0))s] $name"
    if ! "$@" >"$logs/$name.out" 2>"$logs/$name.err"; then
        echo "runs/fingerprint.sh: $name failed: $*" >&2
        tail -n 20 "$logs/$name.out" "$logs/$name.err" >&2
        exit 1
    fi
}

# 1. the data, under OUT_DIR/data (data/prepare.py is the per-dataset scripts' prepare with an --out)
step prepare_shakespeare_char python data/prepare.py --tokenizer char \
    --input "$shared/data/tinyshakespeare/input.txt" --out "$data/shakespeare_char"
step prepare_tangshi python data/prepare.py --tokenizer char \
    --input "$shared/data/tangshi/input.txt" --out "$data/tangshi"
step prepare_tangshi_chat python data/tangshi/conversations.py --dataset "$data/tangshi" --out "$data/tangshi_chat"

# 2. the recipes, 30 iters each: the last iter always evaluates and saves ckpt.pt; the speedrun's
# recipe sets no target_loss, and --target_loss=None says so in case a refactor gives it one
train() {  # train NAME CONFIG DATASET KEY=VALUE...
    local name="$1" config="$2" dataset="$3"; shift 3
    step "train_$name" python train.py "$config" --out_dir="$out/out-$name" --dataset="$data/$dataset" \
        --max_iters=30 --device=cpu --compile=False "$@"
}
train shakespeare_cpu config/shakespeare_char_cpu.py shakespeare_char
train shakespeare_speedrun config/shakespeare_char_speedrun.py shakespeare_char --target_loss=None
train shakespeare_modern config/shakespeare_char_modern.py shakespeare_char
train tangshi config/tangshi_cpu.py tangshi
train tangshi_sft config/tangshi_sft.py tangshi_chat --init_from="$out/out-tangshi"
# RL from the fine-tuned model, 5 iters of 2 prompts x 2 answers each. Under the recipe's gated rewards a 30-iter
# model scores 0 on every answer, so no gradient: tangshi_rl fingerprints sampling, scoring and a 2-key evaluation.
# Under guard alone the two answers to a prompt differ in reward: tangshi_rl_guard steps on a policy gradient and KL.
rl() {  # rl NAME KEY=VALUE...
    local name="$1"; shift
    step "$name" python rl.py config/tangshi_rl.py --init_from="$out/out-tangshi_sft" --out_dir="$out/out-$name" \
        --dataset="$data/tangshi" --max_iters=5 --batch_size=2 --samples=2 --device=cpu "$@"
}
rl tangshi_rl --eval_keys=2 --eval_interval=5
rl tangshi_rl_guard --eval_keys=0 --reward=guard
runs=(shakespeare_cpu shakespeare_speedrun shakespeare_modern tangshi tangshi_sft tangshi_rl tangshi_rl_guard)

# 3. every tensor of each checkpoint, and the logged losses
echo "[$((SECONDS - t0))s] hashes and losses"
python - "$out" "${runs[@]}" >"$out/hashes.txt" <<'EOF'
import hashlib, sys
import torch

def leaves(prefix, value):
    """(key, value) of every tensor or plain value under value, dicts in sorted key order."""
    if isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from leaves(f"{prefix}.{k}", value[k])
    elif isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple, torch.Tensor)) for v in value):
        for i, v in enumerate(value):
            yield from leaves(f"{prefix}.{i}", v)
    else:
        yield prefix, value

def digest(value):
    if isinstance(value, torch.Tensor):
        t = value.detach().contiguous().cpu()
        raw = t.view(torch.uint8) if t.dtype == torch.bfloat16 else t  # numpy has no bfloat16: its bytes
        h = hashlib.sha256(f"{t.dtype} {tuple(t.shape)}\n".encode())
        h.update(raw.numpy().tobytes())
        return h.hexdigest()
    return hashlib.sha256(repr(value).encode()).hexdigest()  # step counts, param_groups' settings

out, runs = sys.argv[1], sys.argv[2:]
for run in runs:
    ckpt = torch.load(f"{out}/out-{run}/ckpt.pt", map_location="cpu", weights_only=True)
    sections = {"model": ckpt["model"], "optimizer": ckpt["optimizer"]}
    if (ckpt.get("rl") or {}).get("reference") is not None:
        sections["reference"] = ckpt["rl"]["reference"]  # the KL's frozen model
    for name, section in sections.items():
        for key, value in leaves(name, section):
            print(run, key, digest(value))
EOF
python - "$out" "${runs[@]}" >"$out/losses.txt" <<'EOF'
import json, sys

TIMING = {"time", "train_time", "ms", "tok_s", "mfu", "seconds", "elapsed", "dt"}
out, runs = sys.argv[1], sys.argv[2:]
for run in runs:
    with open(f"{out}/out-{run}/log.jsonl", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == "config":
                continue  # the settings: paths of this OUT_DIR; their effect is in hashes.txt
            kept = {k: v for k, v in record.items() if k not in TIMING and not k.endswith(("_s", "_time", "_ms"))}
            print(run, json.dumps(kept, sort_keys=True, ensure_ascii=False))
EOF

# 4. seeded texts, each under a header naming its command; paths and timings masked so two runs diff cleanly
texts="$out/texts.txt"
: >"$texts"
mask() {
    sed -E -e "s#$out#OUT#g" -e "s#$repo#REPO#g" \
        -e 's/[0-9][0-9,]*(\.[0-9]+)? ?(tok\/s|tokens\/s|it\/s|ms|s)\b/T \2/g'
}
text() {  # text NAME COMMAND...: its stdout, then its stderr (overrides, notes), into texts.txt
    local name="$1"; shift
    step "$name" "$@"
    { echo "=== $name: ${*#python }"; cat "$logs/$name.out"; echo "--- stderr"; cat "$logs/$name.err"; echo; } \
        | mask >>"$texts"
}
sample() { text "$1" python sample.py --out_dir="$out/out-$2" --device=cpu --seed=1 --num_samples=2 "${@:3}"; }
sample sample_shakespeare shakespeare_cpu --max_new_tokens=60
sample sample_shakespeare_greedy shakespeare_cpu --max_new_tokens=60 --temperature=0
sample sample_tangshi tangshi --max_new_tokens=60
sample sample_tangshi_greedy tangshi --max_new_tokens=60 --temperature=0
# after 30 iters the two greedy texts above are newlines only; the speedrun's model writes words, and 6 + 100
# tokens pass its 64-token context: a changed greedy rule or context shift shows here
sample sample_speedrun_greedy shakespeare_speedrun --max_new_tokens=100 --temperature=0 --start="ROMEO:"
text chat_tangshi_sft python chat.py --out_dir="$out/out-tangshi_sft" --device=cpu --seed=1 --max_new_tokens=60 \
    -p "藏頭詩：春江花月"
text trace_shakespeare python trace.py --out_dir="$out/out-shakespeare_cpu" --device=cpu --seed=1 \
    --start="ROMEO:" --steps=3

# serve.py on a free port (--port=0: its line "serving ... on http://127.0.0.1:PORT/" names it): one completion
# and one chat request, seeded
echo "[$((SECONDS - t0))s] serve"
python serve.py --out_dir="$out/out-tangshi_sft" --device=cpu --port=0 >"$logs/serve.out" 2>"$logs/serve.err" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
port=""
for _ in $(seq 600); do  # up to 60 s to load the model
    port="$(cat "$logs/serve.out" "$logs/serve.err" | sed -nE 's#^serving .* on http://[^:]+:([0-9]+)/.*#\1#p' | head -n 1)"
    [ -n "$port" ] && break
    kill -0 "$server" 2>/dev/null || { echo "runs/fingerprint.sh: serve.py exited:" >&2; cat "$logs/serve.err" >&2; exit 1; }
    sleep 0.1
done
[ -n "$port" ] || { echo "runs/fingerprint.sh: serve.py printed no port in 60 s" >&2; exit 1; }
python - "$port" >"$logs/requests.out" <<'EOF'
import json, sys, time, urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}/v1"
def post(path, body):
    for _ in range(100):  # the socket listens before uvicorn serves
        try:
            request = urllib.request.Request(base + path, json.dumps(body).encode(),
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                return json.load(response)
        except ConnectionError:
            time.sleep(0.1)
    raise SystemExit(f"no answer from {base}{path}")

settings = {"temperature": 0.8, "seed": 7, "max_tokens": 30}
completion = post("/completions", {"prompt": "春眠不覺曉\n", **settings})
print("=== serve.py /v1/completions prompt='春眠不覺曉\\n' temperature=0.8 seed=7 max_tokens=30")
print(json.dumps([c["text"] for c in completion["choices"]], ensure_ascii=False))
print(json.dumps(completion["usage"]))
chat = post("/chat/completions", {"messages": [{"role": "user", "content": "藏頭詩：春江花月"}], **settings})
print("=== serve.py /v1/chat/completions '藏頭詩：春江花月' temperature=0.8 seed=7 max_tokens=30")
print(json.dumps([c["message"]["content"] for c in chat["choices"]], ensure_ascii=False))
print(json.dumps(chat["usage"]))
EOF
kill "$server"
wait "$server" 2>/dev/null || true
trap - EXIT
mask <"$logs/requests.out" >>"$texts"

echo "[$((SECONDS - t0))s] done: $out/{hashes,losses,texts}.txt ($(wc -l <"$out/hashes.txt") tensors)"
