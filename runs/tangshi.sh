#!/usr/bin/env bash
# The Tang poems from nothing to a chat model trained by reinforcement learning, every stage in order:
# prepare the poems, pretrain, build conversations, fine-tune, RL, and evaluate every stage on held-out keys.
# About 30 minutes on 2 CPU cores (docs/results.md#tang-poems-from-pretraining-to-rl).
#
#   bash runs/tangshi.sh                                              # downloads the poems
#   bash runs/tangshi.sh --input ../shared/data/tangshi/input.txt     # offline: a local copy
#   bash runs/tangshi.sh --torchrun                                   # RL as two processes (the measured way)
#
# Each step is the command docs/chat.md and docs/rl.md explain; run one by hand to change its keys.
set -euo pipefail
start="$PWD"  # a relative --input is read from where the script was started
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

input=""        # empty: data/tangshi/prepare.py downloads the corpus
torchrun=0
while [ $# -gt 0 ]; do
    case "$1" in
        --input) input="$2"; shift 2 ;;
        --input=*) input="${1#--input=}"; shift ;;
        --torchrun) torchrun=1; shift ;;
        -h|--help) sed -n '2,10p' "$self"; exit 0 ;;
        *) echo "runs/tangshi.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$input" in ""|/*) ;; *) input="$start/$input" ;; esac

# 1. the poems: data/tangshi/{train,val}.bin and meta.json
if [ -n "$input" ]; then
    python data/tangshi/prepare.py --input "$input"
else
    python data/tangshi/prepare.py
fi
# 2. pretrain: out-tangshi (about 2 minutes)
python train.py config/tangshi_cpu.py
# 3. conversations from the train split: data/tangshi_chat
python data/tangshi/conversations.py
# 4. fine-tune to chat: out-tangshi-sft (about 5 minutes)
python train.py config/tangshi_sft.py
# 5. reinforcement learning on rhyme and tone: out-tangshi-rl (10-16 minutes)
if [ "$torchrun" = 1 ]; then
    torchrun --standalone --nproc_per_node=2 rl.py config/tangshi_rl.py --batch_size=2
else
    python rl.py config/tangshi_rl.py
fi
# 6. every stage on 200 held-out keys
python data/tangshi/evaluate.py --out_dir=out-tangshi-rl --out_dir=out-tangshi-sft --out_dir=out-tangshi --base=out-tangshi

echo "talk to it: python chat.py --out_dir=out-tangshi-rl   (try 藏頭詩：春江花月)"
