"""How to train: TrainConfig, train.py's keys and defaults (the model's are GPTConfig's).

A module of its own so that programs other than train.py (bench.py) build the same config
without importing the training script.
"""
from dataclasses import dataclass, fields, replace

from model import GPTConfig
from nanogpt.device import Device, Dtype
from nanogpt.generate import check_seed
from nanogpt.source import check_init_from
from nanogpt.training.resume import names_code


# The rules of the settings train.py shares with the other programs that train (rl.py), kept in one place so
# that a value one refuses, every one refuses. A key a program lacks, or leaves None, is not checked.
AT_LEAST_ONE = ("batch_size", "gradient_accumulation_steps", "eval_interval", "log_interval", "eval_iters")
NON_NEGATIVE = ("max_iters", "warmup_iters", "lr_decay_iters", "learning_rate", "min_lr", "embedding_lr", "grad_clip",
                "cooldown_iters", "eval_windows", "muon_lr", "weight_decay", "muon_weight_decay")
FRACTIONS = ("beta1", "beta2", "muon_momentum")  # in [0, 1): decays of a running average


def check_settings(cfg):
    """A ValueError naming the first of cfg's shared settings that breaks its rule, with its value."""
    def present(names):
        return [(name, getattr(cfg, name)) for name in names if getattr(cfg, name, None) is not None]
    for name, value in present(AT_LEAST_ONE):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for name, value in present(NON_NEGATIVE):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    for name, value in present(FRACTIONS):
        if not 0 <= value < 1:
            raise ValueError(f"{name} must be in [0, 1), got {value}")
    if hasattr(cfg, "seed"):
        check_seed(cfg.seed)


@dataclass
class TrainConfig(Device, Dtype, GPTConfig):
    """How to train: the model's fields are GPTConfig's (n_layer, block_size, ...), device and dtype are
    nanogpt.device's, the rest are here."""

    # I/O
    out_dir: str = "out"  # checkpoints and log.jsonl go here
    eval_interval: int = 2000  # evaluate (and save) every this many iters
    log_interval: int = 1  # print and log the training loss every this many iters
    eval_iters: int = 200  # batches per split in each evaluation
    eval_only: bool = False  # evaluate once and exit
    always_save_checkpoint: bool = True  # False: at evals, write ckpt.pt only when val loss improves
    keep_best: bool = True  # also keep best.pt, the checkpoint with the best val loss
    init_from: str = "scratch"  # "scratch", "resume" (out_dir/ckpt.pt), a checkpoint to fine-tune (its out_dir or file), or GPT-2 weights: gpt2, ..., a local HF dir
    wandb_log: bool = False  # also log to Weights & Biases (pip install wandb)
    wandb_project: str = "owt"
    wandb_run_name: str = "gpt2"
    # data
    dataset: str = "openwebtext"  # data/<dataset>/, or a path to a directory
    gradient_accumulation_steps: int = 5 * 8  # micro-batches per iter, over all processes
    batch_size: int = 12  # micro-batch size, per process
    vocab_size: int = 50304  # the model's vocabulary where the dataset has no meta.json (GPT-2's, padded)
    # optimizer: AdamW, or Muon for the blocks' matrices with AdamW for the rest
    optimizer: str = "adamw"  # "adamw" or "muon"
    muon_lr: float = 0.02  # Muon's peak learning rate (scheduled like learning_rate)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    learning_rate: float = 6e-4  # AdamW's peak learning rate
    embedding_lr: float | None = None  # AdamW's peak rate, undecayed, for the token and value embeddings (the head too, where tied); None: learning_rate
    max_iters: int = 600000  # total optimizer steps
    weight_decay: float = 1e-1  # AdamW's decoupled decay, for matrices and embeddings only
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay
    grad_clip: float = 1.0  # 0 disables clipping
    # schedule: linear warmup, then cosine decay to min_lr ("cosine"), or constant then a linear
    # cool-down to min_lr over the last cooldown_iters before lr_decay_iters ("wsd": warmup-stable-decay)
    decay_lr: bool = True  # False: learning_rate throughout
    lr_schedule: str = "cosine"  # "cosine" or "wsd"
    cooldown_iters: int = 0  # wsd: iters of linear decay at the end
    warmup_iters: int = 2000  # iters of linear warmup from 0
    lr_decay_iters: int = 600000  # ~ max_iters, per Chinchilla
    min_lr: float = 6e-5  # ~ learning_rate / 10
    # system
    compile: bool | None = None  # torch.compile the model; None: on CUDA yes (it pays off), elsewhere no
    packed_linear: bool | None = None  # CPU, float32: linear layers through oneDNN on packed weights (kernels.py); None: where it applies
    matmul_dtype: str = "float32"  # CPU: training's products (linear layers, Muon) in float32, bfloat16, or auto (bfloat16 where native)
    backend: str = "auto"  # torch.distributed backend: auto (nccl on CUDA, gloo on CPU), nccl, gloo
    parallel: str = "ddp"  # under torchrun: ddp (a whole copy per process) or fsdp (parameters, grads, optimizer sharded)
    activation_checkpointing: bool = False  # recompute each Block's activations in backward: less memory, ~1/3 more compute
    seed: int = 1337  # initial weights, batches and dropout all follow from it
    peak_flops: float | None = None  # the device's peak FLOP/s for MFU (bench.py measures it)
    # measurement: val loss over fixed windows, and stopping at a target
    eval_windows: int = 0  # > 0: val loss over this many fixed block_size windows spread over val, not eval_iters batches
    target_loss: float | None = None  # stop once val loss <= target_loss (and report the training time it took)
    # --minutes=N: the plan chooses every key you did not set for the best model in N minutes (plan.py, docs/minutes.md)
    minutes: float | None = None  # wall-clock budget from process start to exit; None: train as configured
    plan_teachers: bool = True  # a text used up well before the budget: two teachers, then the model (parts.py)
    # distillation (distill.py): the model also learns the mean next-token distribution of trained models
    teacher: str = ""  # checkpoints (out_dirs or files, comma-separated) of this dataset's tokenizer; "" for none
    distill: float = 0.8  # with teacher: the share of the loss that is the KL to the teachers', the rest the text's
    # lm-eval tasks scored at each evaluation (train_tasks.py, docs/eval.md)
    eval_tasks: str = ""  # lm-eval task names, comma-separated: tangshi_next_line; "" for none
    eval_tasks_limit: int = 100  # the first this many items of each task, the same ones at every evaluation
    eval_tasks_include_path: str = names_code("tasks")  # task YAMLs beside lm-eval's (ours: tasks); never from a ckpt


    def __post_init__(self):
        super().__post_init__()  # the model's fields
        check_init_from(self.init_from, ("scratch", "resume", "checkpoint", "pretrained"))  # a checkpoint: fine-tuned
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"optimizer must be adamw or muon, got {self.optimizer!r}")
        if self.parallel not in ("ddp", "fsdp"):
            raise ValueError(f"parallel must be ddp or fsdp, got {self.parallel!r}")
        if self.lr_schedule not in ("cosine", "wsd"):
            raise ValueError(f"lr_schedule must be cosine or wsd, got {self.lr_schedule!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.matmul_dtype not in ("float32", "bfloat16", "auto"):
            raise ValueError(f"matmul_dtype must be float32, bfloat16 or auto, got {self.matmul_dtype!r}")
        check_settings(self)
        if self.eval_tasks_limit < 1:
            raise ValueError(f"eval_tasks_limit must be at least 1, got {self.eval_tasks_limit}")
        if self.minutes is not None and not (0 < self.minutes < float("inf")):
            raise ValueError(f"minutes must be a positive number of minutes, got {self.minutes}")
        if not 0 <= self.distill <= 1:
            raise ValueError(f"distill must be in [0, 1] (the teachers' share of the loss), got {self.distill}")
        if self.peak_flops is not None and self.peak_flops <= 0:
            raise ValueError(f"peak_flops must be > 0 (or None), got {self.peak_flops}")

    def model_config(self, vocab_size):
        """The model's shape: this config's GPTConfig fields, with the vocabulary the data has."""
        return replace(GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)}), vocab_size=vocab_size)
