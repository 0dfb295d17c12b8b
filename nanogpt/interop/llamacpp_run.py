"""llama.cpp driven through llama-cpp-python's C API, for bench.py's comparison (--only=llama): greedy decoding of
one sequence, or of several at once as llama.cpp's server batches them, one llama_decode per step and nothing in
Python around it but an argmax. llama-cpp-python builds llama.cpp from source (docs/generation.md says how)."""
import numpy as np

_quiet = None  # the log callback given to llama.cpp: kept alive here, as C holds a pointer to it


def available():
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


class LlamaCpp:
    """A GGUF file loaded by llama.cpp with `threads` threads and room for `sequences` sequences of n_ctx tokens.

    extra_buffers False turns off llama.cpp's extra buffer types (weights repacked for AMX and the like): its Q8_0
    products on them crash on a batch of several tokens on some CPUs (llama-cpp-python 0.3.36 on an Intel Xeon
    with AMX), so bench.py's batched Q8_0 runs go without them."""

    def __init__(self, path, threads, n_ctx, sequences=1, extra_buffers=True):
        import llama_cpp as L
        self.L = L
        global _quiet
        L.llama_backend_init()
        if _quiet is None:  # its load report is not ours to print
            _quiet = L.llama_log_callback(lambda level, text, data: None)
            L.llama_log_set(_quiet, None)
        params = L.llama_model_default_params()
        params.use_extra_bufts = extra_buffers
        self.model = L.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_seq_max = n_ctx * sequences, sequences
        cp.n_batch = cp.n_ubatch = max(n_ctx, sequences)
        cp.n_threads = cp.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {path}")
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.sequences = sequences

    def greedy(self, first, n):
        """n greedy tokens after the token `first`, in each of the sequences (all alike): a list per sequence."""
        L, s = self.L, self.sequences
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        batch = L.llama_batch_init(s, 0, s)
        out, current = [[] for _ in range(s)], [first] * s
        try:
            for pos in range(n):
                batch.n_tokens = s
                for i in range(s):
                    batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = current[i], pos, 1, 1
                    batch.seq_id[i][0] = i
                if L.llama_decode(self.ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
                for i in range(s):
                    logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.vocab,))
                    current[i] = int(logits.argmax())
                    out[i].append(current[i])
        finally:
            L.llama_batch_free(batch)
        return out

    def close(self):
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)
