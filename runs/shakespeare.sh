#!/usr/bin/env bash
# The quick start: prepare tiny Shakespeare, train the laptop recipe, sample from it.
# About 2 minutes on 2 CPU cores (docs/results.md#the-quick-start).
#
#   bash runs/shakespeare.sh                                                  # downloads input.txt
#   bash runs/shakespeare.sh --input ../shared/data/tinyshakespeare/input.txt # offline: a local copy
set -euo pipefail
start="$PWD"  # a relative --input is read from where the script was started
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$self")/.."

input=""        # empty: data/shakespeare_char/prepare.py downloads the corpus
while [ $# -gt 0 ]; do
    case "$1" in
        --input) input="$2"; shift 2 ;;
        --input=*) input="${1#--input=}"; shift ;;
        -h|--help) sed -n '2,6p' "$self"; exit 0 ;;
        *) echo "runs/shakespeare.sh: unknown option '$1' (try --help)" >&2; exit 2 ;;
    esac
done
case "$input" in ""|/*) ;; *) input="$start/$input" ;; esac

if [ -n "$input" ]; then
    python data/shakespeare_char/prepare.py --input "$input"
else
    python data/shakespeare_char/prepare.py
fi
python train.py config/shakespeare_char_cpu.py      # out-shakespeare-char-cpu: val loss about 1.90
python sample.py --out_dir=out-shakespeare-char-cpu
