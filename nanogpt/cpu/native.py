"""decode.c's few-row products and decode step, compiled on first use with this machine's C compiler and called through ctypes.

Decoding multiplies a row (or one per sequence) by every weight matrix, and PyTorch's own one-row products read
bfloat16 and int8 weights at about half the rate they read float32 ones (docs/generation.md). decode.c reads all
three at close to the rate this CPU streams memory. It is compiled once per machine (the source, the compiler,
its flags and this CPU's features name the library) into the user's cache directory and loaded from there;
where no C compiler works, or NANOGPT_NATIVE=0, available() is False and decoding keeps PyTorch's products.
It has two sets of loops, AVX-512's and AVX2's (vector_loops() says which this CPU runs); NANOGPT_NATIVE=avx2 builds
the AVX2 ones on a CPU that has AVX-512 too.

The cache directory is NANOGPT_CACHE, else $XDG_CACHE_HOME/nanogpt, else ~/.cache/nanogpt. A library is loaded
only from a directory this user owns and no one else may write to: another user's file there would be code run
as this one. Elsewhere it is compiled into a private temporary directory for this process.
"""
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import torch

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "decode.c")
# tried in order: the first that compiles is used (no OpenMP: one thread; no -march=native: no vector loops). A
# function the compiler has no declaration for is an error, not a warning: else the library builds with the name
# unresolved and fails only as it loads (__rdtsc, which GCC 10's immintrin.h does not declare)
STRICT = "-Werror=implicit-function-declaration"
FLAGS = (["-O3", "-march=native", "-fopenmp", STRICT], ["-O3", "-march=native", STRICT], ["-O3", STRICT])
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}
ACTIVATIONS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "relu2": 4}
COMPILE_SECONDS = 300  # a compiler that hangs longer is given up on: decoding keeps PyTorch's products
_lock = threading.Lock()
_library = {}  # "lib": the loaded library or None, "why": why not


def cache_dir():
    for path in (os.environ.get("NANOGPT_CACHE"),
                 os.environ.get("XDG_CACHE_HOME") and os.path.join(os.environ["XDG_CACHE_HOME"], "nanogpt")):
        if path:
            return path
    return os.path.join(os.path.expanduser("~"), ".cache", "nanogpt")


def private(path):
    """True where path is a directory this user owns and only this user may write to."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return os.path.isdir(path) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def owned(path):
    """True where path is a file this user owns and only this user may write to."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def cpu_features():
    """What names this CPU's instruction set: /proc/cpuinfo's flags line (Linux), else the platform's words."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.machine() + platform.processor()


def compiler():
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(cc, directory):
    """The path of the library compiled from SOURCE into directory (already there: reused), or raise
    OSError with the compiler's last line."""
    with open(SOURCE, "rb") as f:
        source = f.read()
    errors = []
    for flags in FLAGS:
        if os.environ.get("NANOGPT_NATIVE") == "avx2" and "-march=native" in flags:
            flags = [*flags, "-mno-avx512f"]  # the AVX2 loops on a CPU that has AVX-512 too: to compare, or test them
        key = hashlib.sha256(b"\0".join([source, cc.encode(), " ".join(flags).encode(), cpu_features().encode()]))
        path = os.path.join(directory, f"decode-{key.hexdigest()[:16]}.so")
        if os.path.exists(path):
            return path
        tmp = f"{path}.{os.getpid()}.tmp"
        run = subprocess.run([cc, *flags, "-fPIC", "-shared", "-o", tmp, SOURCE, "-lm"],
                             capture_output=True, text=True, timeout=COMPILE_SECONDS)
        if run.returncode == 0:
            os.replace(tmp, path)  # whole or not at all: another process may be loading it
            return path
        lines = run.stderr.strip().splitlines() or ["failed"]
        errors.append(next((line for line in lines if "error:" in line), lines[-1]))  # the first error, not a summary
    raise OSError(errors[-1])


def library():
    """The loaded library, or None (available() says why)."""
    with _lock:
        if "lib" not in _library:
            _library["lib"], _library["why"] = load()
        return _library["lib"]


def load():
    if os.environ.get("NANOGPT_NATIVE", "1") == "0":
        return None, "NANOGPT_NATIVE=0"
    cc = compiler()
    if cc is None:
        return None, "no C compiler (cc, gcc or clang) on PATH"
    directory = cache_dir()
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        pass
    scratch = None
    if not private(directory):
        directory = scratch = tempfile.mkdtemp(prefix="nanogpt-native-")
    try:
        path = build(cc, directory)
        if not (private(directory) and owned(path)):  # checked again: the directory may have changed since
            raise OSError(f"{directory} is not private to this user")
        lib = ctypes.CDLL(path)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"decode.c did not compile: {e}"
    finally:
        if scratch:  # loaded (mapped) or failed: the file is not needed again
            shutil.rmtree(scratch, ignore_errors=True)
    p, i = ctypes.c_void_p, ctypes.c_int
    lib.matvec.argtypes = [p, i, p, i, p, p, p, p, i, i, i, i, i]
    lib.model_step.argtypes = [p, p, i, p, p, p, p, ctypes.c_long, p, i]
    f = ctypes.c_float
    lib.model_run.argtypes = [p, p, i, p, p, p, p, ctypes.c_long, p, i, p, f, f, p, f, p, i]
    lib.matvec.restype = lib.model_step.restype = lib.model_run.restype = lib.matvec_vector.restype = ctypes.c_int
    return lib, ""


def available():
    """True where the library compiled and loaded with its vector loops, AVX-512 or AVX2 (a build without them
    would sum one value at a time, slower than PyTorch's)."""
    lib = library()
    return lib is not None and lib.matvec_vector() in (256, 512)


def vector_loops():
    """The loops decode.c runs on this CPU: "AVX-512", "AVX2", or None where available() is False."""
    return {512: "AVX-512", 256: "AVX2"}.get(library().matvec_vector()) if available() else None


def why():
    """Why available() is False ("" where it is True)."""
    lib = library()
    if lib is not None and not lib.matvec_vector():
        return "this CPU or compiler has neither AVX-512 nor AVX2 with FMA"
    return _library["why"]


class Weight:
    """A weight as decode.c multiplies it: product(x, act, residual) is act(x W[:, :width]^T * scale + bias) +
    residual, float32 (B, N), for x (B, width). weight (N, K >= width) float32, bfloat16 or int8, contiguous;
    scale float32 (N,) (int8 rows) or None; bias (N,) or None; act None, "relu", "relu2", "gelu" or
    "gelu_tanh". On torch's thread count. Everything a call does not change is set here: a
    decode step makes some 25 of these calls, and Python's work per call is a share of the step."""
    __slots__ = ("weight", "scale", "bias", "args", "width", "N", "call")

    def __init__(self, weight, scale=None, bias=None, width=None):
        assert weight.is_contiguous() and weight.dtype in KINDS and (scale is None) != (weight.dtype == torch.int8)
        self.weight, self.scale, self.bias, self.N = weight, scale, bias, weight.size(0)
        self.args = (weight.data_ptr(), KINDS[weight.dtype], None if scale is None else scale.data_ptr())
        self.width = (weight.size(1) if width is None else width, weight.size(1), weight.size(0))
        self.call = library().matvec

    def __call__(self, x, act=None, residual=None):
        if x.dtype is not torch.float32 or not x.is_contiguous():
            x = x.float().contiguous()  # attention's output under autocast is bfloat16: the library reads memory
        if residual is not None and (residual.dtype is not torch.float32 or not residual.is_contiguous()):
            residual = residual.float().contiguous()
        y = torch.empty(x.size(0), self.N, dtype=torch.float32)  # what the library writes, whatever the default
        bias = self.bias
        w, kind, scale = self.args
        if self.call(x.data_ptr(), x.size(0), w, kind, scale, None if bias is None else bias.data_ptr(),
                     None if residual is None else residual.data_ptr(), y.data_ptr(), *self.width,
                     ACTIVATIONS[act], torch.get_num_threads()):
            raise MemoryError("no memory for a decode step's input rows")
        return y


class Linear(ctypes.Structure):
    """decode.c's linear: a Weight as model_step reads it."""
    _fields_ = [("w", ctypes.c_void_p), ("scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("kind", ctypes.c_int),
                ("K", ctypes.c_int), ("ldw", ctypes.c_int), ("N", ctypes.c_int)]


class Layer(ctypes.Structure):
    """decode.c's layer: one Block's shape, norms and products."""
    _fields_ = [(name, ctypes.c_int) for name in ("C", "nh", "nkv", "hs", "hidden", "block", "rms", "act", "qk_norm")] \
        + [("eps", ctypes.c_float)] + [(name, ctypes.c_void_p) for name in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")] \
        + [(name, Linear) for name in ("c_attn", "c_proj", "c_fc", "mlp_proj")]


def linear_of(weight):
    """A Weight as decode.c's linear (its pointers: the Weight must outlive it)."""
    w, kind, scale = weight.args
    K, ldw, N = weight.width
    return Linear(w, scale, None if weight.bias is None else weight.bias.data_ptr(), kind, K, ldw, N)


def layer_of(config, ln_1, c_attn, c_proj, ln_2, c_fc, mlp_proj):
    """One Block for model_step: config a GPTConfig, ln_1 and ln_2 (weight,) or (weight, bias) (a bias may be None),
    the four products Weights. Everything it points to must outlive it (fused_step.FusedStep holds them)."""
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    norm_1, norm_2 = (tuple(ln_1) + (None,))[:2], (tuple(ln_2) + (None,))[:2]
    return Layer(config.n_embd, config.n_head, config.kv_heads, config.head_dim, c_fc.width[2],
                 config.block_size, config.norm == "rmsnorm", ACTIVATIONS[config.activation], bool(config.qk_norm),
                 config.norm_eps, ptr(norm_1[0]), ptr(norm_1[1]), ptr(norm_2[0]), ptr(norm_2[1]),
                 linear_of(c_attn), linear_of(c_proj), linear_of(c_fc), linear_of(mlp_proj))


class Model(ctypes.Structure):
    """decode.c's model: the embeddings, the blocks (Layers), the final norm and the output layer."""
    _fields_ = [(name, ctypes.c_int) for name in ("n_layer", "C", "vocab", "rms")] + [("eps", ctypes.c_float)] \
        + [(name, ctypes.c_void_p) for name in ("wte", "wpe", "rope", "lnf_w", "lnf_b", "layers")] + [("head", Linear)]


def model_of(config, wte, wpe, rope, ln_f, layers, head):
    """The model for model_step: wte (vocab, C) and wpe (block, C) or None float32, rope the (block, hs / 2, 2)
    table or None, ln_f (weight,) or (weight, bias), layers (layer_of's, one a block), head a Weight. Everything
    it points to must outlive it: the returned (Model, what it holds) keeps the layers' array."""
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    norm = (tuple(ln_f) + (None,))[:2]
    array = (Layer * len(layers))(*layers)
    model = Model(len(layers), config.n_embd, wte.size(0), config.norm == "rmsnorm", config.norm_eps, ptr(wte),
                  ptr(wpe), ptr(rope), ptr(norm[0]), ptr(norm[1]), ctypes.cast(array, ctypes.c_void_p), linear_of(head))
    return model, array


def model_step(model, tokens, rows, k, v):
    """Logits (B, vocab) float32 of tokens (B,) for model (model_of's), the softcap not applied: rows int32 (2, B)
    contiguous, each row's position and its slot; k, v the cache (n_layer, slots, nkv, block, hs) float32
    contiguous, written at each row's slot and position."""
    tokens = tokens.long().contiguous()
    logits = torch.empty(tokens.size(0), model.head.N, dtype=torch.float32)
    status = library().model_step(ctypes.byref(model), tokens.data_ptr(), tokens.size(0), rows.data_ptr(),
                                  rows[1].data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), logits.data_ptr(),
                                  torch.get_num_threads())
    check(status, model)
    return logits


# of the cumulative total: a draw this near a token's edge is left to PyTorch (sample_one); a softcap adds
# 16 * FLT_EPSILON * softcap / temperature to it: tanhf and torch.tanh 2 ulps apart at most, on a logit and on the
# largest, scaled by the temperature, move a share by 8 of them; twice that
SAMPLE_TOLERANCE = 1e-5


def model_run(model, tokens, rows, k, v, n, temperature=0.0, draws=None, softcap=None):
    """(tokens (s, B) int64, logits (B, vocab)): up to n steps from tokens (B,), as calls of model_step each followed
    by sample_next's choice, fed to the next step, the rows' positions one further each step: at temperature 0 the
    first largest logit (after the softcap where one is given), else the token generate.pick takes with the row's
    draw (draws (n, B) float32, sample_next's), with no top-k, top-p or penalty. s < n where a choice could go
    either way between decode.c's rounding and PyTorch's (two capped logits within a few ulps, a draw within
    SAMPLE_TOLERANCE of a token's edge, a NaN to sample from): step s then ran, its logits (not capped) are
    returned and its choices are the caller's. rows as model_step's, left as they were; the cache must have room
    for n more positions in every row."""
    tokens = tokens.long().contiguous()
    rows = rows.clone()  # decode.c advances the positions in place
    draws = None if draws is None else draws.float().contiguous()
    logits = torch.empty(tokens.size(0), model.head.N, dtype=torch.float32)
    out = torch.empty(n, tokens.size(0), dtype=torch.long)
    decided = ctypes.c_int(0)
    check(library().model_run(ctypes.byref(model), tokens.data_ptr(), tokens.size(0), rows.data_ptr(),
                              rows[1].data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), logits.data_ptr(), n,
                              out.data_ptr(), softcap or 0.0, temperature, None if draws is None else draws.data_ptr(),
                              SAMPLE_TOLERANCE, ctypes.byref(decided), torch.get_num_threads()), model)
    return out[:decided.value], logits


def check(status, model):
    """model_step's and model_run's status as Python's error."""
    if status == -3:
        raise IndexError(f"a token id is outside the vocabulary [0, {model.vocab})")
    if status:
        raise MemoryError("no memory for a decode step's activations")
