"""Chat datasets: conversations in OpenAI's fine-tuning JSONL rendered by the chat template into token ids,
with a mask of what the fine-tuning loss sees (the assistant's words and its <|end|>) and an index of where
each conversation starts. data/chat/prepare.py and data/tangshi/conversations.py write them with it."""
import json
import os
import shutil
import tempfile

import numpy as np
from tqdm import tqdm

from nanogpt.checkpoint import load_checkpoint
from nanogpt.copies import write_index
from nanogpt.errors import UserError
from nanogpt.files import find_folder, open_regular, open_to_write
from nanogpt.source import checkpoint_file
from nanogpt.tokenizer import ROLES, chat_meta, read_meta, tokenizer_from_meta
from nanogpt.values import how_many

SHOWN = 5  # bad lines reported one by one; the rest are counted
MAX_LINE_BYTES = 1 << 24  # a line longer than this is not a conversation of any context


def base_dir(base):
    """data/<base> (beside this repository or under the working directory), or base itself if a directory."""
    found = find_folder(base, "data", holding=["meta.json", "meta.pkl"])
    if found is not None:
        return found
    raise UserError(f"base dataset {base} has no meta.json; prepare it first (python data/{base}/prepare.py, or "
                    f"python data/prepare.py --input FILE --out data/{base})")


def messages_of(line):
    """The conversation's messages, checked; a ValueError saying what is wrong otherwise."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not JSON ({str(e).splitlines()[0][:80]})") from None
    messages = record.get("messages") if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError('not a {"messages": [...]} object')
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            role = m.get("role") if isinstance(m, dict) else m
            raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str) or not m["content"]:
            raise ValueError(f"a {m['role']} message with empty or non-text content")
        if m.get("weight", 1) not in (0, 1):
            raise ValueError(f"weight is {m['weight']!r}; OpenAI's format allows 0 or 1")
    if not any(m["role"] == "assistant" and m.get("weight", 1) for m in messages):
        raise ValueError("no assistant message to learn from")
    return messages


def encode_conversation(tokenizer, messages, block_size):
    """(ids, mask) of a conversation, or a ValueError (characters the vocabulary lacks, longer than the context)."""
    try:
        ids, mask = tokenizer.render(messages, reply=False)
    except UserError as e:
        raise ValueError(str(e).split(";")[0]) from None
    for i, m in enumerate(messages):  # weight 0: the assistant's message is context
        if m["role"] == "assistant" and not m.get("weight", 1):
            mask = unmask_turn(ids, mask, tokenizer, i)
    if len(ids) > block_size + 1:
        raise ValueError(f"{len(ids)} tokens, longer than the context (block_size {block_size} + 1)")
    return ids, mask


def unmask_turn(ids, mask, tokenizer, turn):
    """mask with the turn-th message's tokens (from its role token to its <|end|>) set to 0."""
    starts = [i for i, t in enumerate(ids) if t in tokenizer.names and t != tokenizer.end]
    end = starts[turn + 1] if turn + 1 < len(starts) else len(ids)
    return mask[:starts[turn]] + [0] * (end - starts[turn]) + mask[end:]


def read_conversations(path, tokenizer, block_size, log):
    """[(ids, mask)] of the file's good lines; bad ones are reported and skipped."""
    good, bad = [], []
    with open_regular(path) as f, tqdm(total=os.path.getsize(path), unit="B", unit_scale=True, desc="encode",
                                     disable=None) as bar:
        for number, raw in enumerate(f, start=1):
            bar.update(len(raw))
            try:
                if len(raw) > MAX_LINE_BYTES:
                    raise ValueError(f"{len(raw):,} bytes on one line")
                line = raw.decode("utf-8")
                if line.strip():
                    good.append(encode_conversation(tokenizer, messages_of(line), block_size))
            except UnicodeDecodeError as e:
                bad.append(f"{path}:{number}: not UTF-8 (bad byte at offset {e.start})")
            except ValueError as e:
                bad.append(f"{path}:{number}: {e}")
    for line in bad[:SHOWN]:
        log(f"skipped {line}")
    if len(bad) > SHOWN:
        log(f"skipped {how_many(len(bad) - SHOWN, 'more bad line')}")
    if not good:
        raise UserError(f"{path} has no usable conversation ({len(bad):,} bad lines); see the lines above and "
                        f"OpenAI's fine-tuning format: {{\"messages\": [{{\"role\": \"user\", \"content\": ...}}, ...]}}")
    return good, len(bad)


def write_split(conversations, out_dir, split, dtype):
    """split.bin, split_mask.bin and split_index.bin of these conversations, in out_dir."""
    ids = np.fromiter((t for c, _ in conversations for t in c), dtype=dtype)
    mask = np.fromiter((m for _, ms in conversations for m in ms), dtype=np.uint8)
    index = np.cumsum([0] + [len(c) for c, _ in conversations], dtype=np.int64)
    ids.tofile(os.path.join(out_dir, f"{split}.bin"))
    mask.tofile(os.path.join(out_dir, f"{split}_mask.bin"))
    index.tofile(os.path.join(out_dir, f"{split}_index.bin"))
    return {"conversations": len(conversations), "tokens": len(ids), "targets": int(mask.sum())}


def prepare_chat(input_path, base, out_dir, block_size=1024, val_fraction=0.1, log=print):
    """A chat dataset in out_dir from input_path's conversations and base's tokenizer; returns its counts.
    out_dir is replaced only once everything is written."""
    if not os.path.isfile(input_path):
        raise UserError(f"--input {input_path} not found; give a JSONL file of {{\"messages\": [...]}} lines")
    if not 0 < val_fraction < 1:
        raise UserError(f"--val_fraction must be between 0 and 1, got {val_fraction}")
    if block_size < 2:
        raise UserError(f"--block_size must be at least 2, got {block_size}")
    source = base_dir(base)
    check_out(out_dir, source)
    meta_of_base = read_meta(source)
    if (meta_of_base or {}).get("chat"):
        raise UserError(f"--base {base} is a chat dataset (made from {meta_of_base.get('base', 'another')}): its role "
                        f"tokens would be added twice; pass --base {meta_of_base.get('base', 'DATASET')}, the dataset "
                        f"the model was pretrained on")
    meta = chat_meta(meta_of_base)
    tokenizer = tokenizer_from_meta({**meta, "ranks_text": read_meta(source).get("ranks_text")})
    meta["dtype"] = "uint16" if meta["vocab_size"] <= 1 << 16 else "uint32"
    meta["base"] = os.path.basename(os.path.normpath(source))
    conversations, skipped = read_conversations(input_path, tokenizer, block_size, log)
    n_val = max(1, round(len(conversations) * val_fraction))
    if n_val >= len(conversations):
        raise UserError(f"{input_path} has {how_many(len(conversations), 'usable conversation')}: too few for a "
                        f"train and a val split; give more")
    # a fresh name beside out_dir: a fixed one could be a directory the user keeps (even --base itself)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.normpath(out_dir))}.", suffix=".tmp",
                           dir=os.path.dirname(os.path.abspath(out_dir)))
    try:
        counts = {"train": write_split(conversations[:-n_val], tmp, "train", np.dtype(meta["dtype"])),
                  "val": write_split(conversations[-n_val:], tmp, "val", np.dtype(meta["dtype"])), "skipped": skipped}
        write_index(tmp, np.dtype(meta["dtype"]))  # where answers were copied from (nanogpt/copies.py)
        if meta.get("ranks"):  # a trained BPE's merges live beside meta.json
            shutil.copyfile(os.path.join(source, meta["ranks"]), os.path.join(tmp, meta["ranks"]))
        with open_to_write(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, ensure_ascii=False)
        replace_dir(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already where replace_dir moved it into place
    log(f"vocab size: {meta['vocab_size']:,} ({tokenizer.base.vocab_size:,} of {meta['base']} and "
        f"{len(meta['chat'])} role tokens)")
    for split in ("train", "val"):
        c = counts[split]
        log(f"{split} has {c['conversations']:,} conversations, {c['tokens']:,} tokens, {c['targets']:,} of them "
            f"targets ({c['targets'] / c['tokens']:.0%})")
    return counts


def check_out(out_dir, source):
    """Refuse, before anything is written, an out_dir that replacing would lose data: the base dataset itself,
    or anything there but nothing or a chat dataset (meta.json with role tokens)."""
    if os.path.exists(out_dir) and os.path.samefile(out_dir, source):
        raise UserError(f"--out {out_dir} is the base dataset {source}, which the chat dataset would replace; "
                        f"choose another --out (e.g. --out {os.path.normpath(out_dir)}_chat)")
    if not os.path.isdir(out_dir) or not os.listdir(out_dir):
        return
    try:
        meta = read_meta(out_dir)
    except UserError:
        meta = None
    if not (meta or {}).get("chat"):
        raise UserError(f"--out {out_dir} exists and is not a chat dataset, so replacing it would lose what it holds; "
                        f"choose another --out, or remove it yourself")


def replace_dir(tmp, out_dir):
    """Move the finished tmp directory to out_dir, the previous out_dir (if any) only removed after."""
    old = None
    if os.path.exists(out_dir):
        if os.path.isfile(out_dir):
            raise UserError(f"--out {out_dir} is a file; choose a directory")
        old = tmp[:-len(".tmp")] + ".old"  # as fresh as tmp: mkdtemp made the name unique
        os.replace(out_dir, old)
    os.replace(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def model_defaults(init_from, base, block_size):
    """(base, block_size): as given, else init_from's checkpoint's dataset and context (1024 without one).
    A context longer than the checkpoint's is refused: train.py would leave out what only it fits. None alone
    means "the default": a block_size of 0 is refused (prepare_chat's rule), never read as none given."""
    if block_size is not None and block_size < 2:
        raise UserError(f"--block_size must be at least 2, got {block_size}")
    if init_from is None:
        if base is None:
            raise UserError("give --init_from OUT_DIR (the checkpoint to fine-tune) or --base DATASET")
        return base, 1024 if block_size is None else block_size
    path = checkpoint_file(init_from)
    if path is None:
        raise UserError(f"--init_from {init_from} holds no training checkpoint (an out_dir with ckpt.pt, or the "
                        f"file); train one first, or give --base DATASET instead")
    ckpt = load_checkpoint(path, weights=False)
    context = int(ckpt["model_args"]["block_size"])
    if block_size is not None and block_size > context:
        raise UserError(f"--block_size {block_size} is longer than {init_from}'s context ({context}): fine-tuning "
                        f"would leave out the conversations only it fits; omit --block_size (it is then {context})")
    return base or ckpt.get("config", {}).get("dataset"), context if block_size is None else block_size
