#!/usr/bin/env bash
# The CPU speedrun against its reference, back to back on one machine, and the figure of both curves:
# the GPT-2-style laptop recipe run to completion, then the speedrun config stopped at val loss 1.88.
# Both are scored on the same 1,600 fixed val windows (docs/speedrun.md says how the time is counted).
#
#   bash runs/speedrun.sh                                                     # downloads input.txt
#   bash runs/speedrun.sh --input ../shared/data/tinyshakespeare/input.txt    # offline: a local copy
set -euo pipefail
start="$PWD"  # a relative --input is read from where the script was started
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

input=""
while [ $# -gt 0 ]; do
    case "$1" in
        --input) input="$2"; shift 2 ;;
        --input=*) input="${1#--input=}"; shift ;;
        -h|--help) sed -n '2,7p' "$self"; exit 0 ;;
        *) echo "runs/speedrun.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$input" in ""|/*) ;; *) input="$start/$input" ;; esac

if [ ! -f data/shakespeare_char/train.bin ]; then
    if [ -n "$input" ]; then
        python data/shakespeare_char/prepare.py --input "$input"
    else
        python data/shakespeare_char/prepare.py
    fi
fi
python train.py config/shakespeare_char_cpu.py --eval_windows=1600 --eval_interval=2000   # the reference
python train.py config/shakespeare_char_speedrun.py --target_loss=1.88 --eval_interval=5   # the speedrun
python plot.py out-shakespeare-char-cpu out-shakespeare-char-speedrun --png speedrun.png --target=1.88
