"""train.py's main, except that rank 1 raises at iteration 3's batch: a rank failing mid-run."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402
from nanogpt.training import batches  # noqa: E402

if os.environ.get("RANK") == "1":
    original = batches.Batches.get

    def failing(self, split, key):
        if key[0] == train.TRAINING and key[1] == 3:
            raise RuntimeError("rank 1 failed on purpose")
        return original(self, split, key)
    batches.Batches.get = failing

if __name__ == "__main__":
    train.program.run_main(train.main)
