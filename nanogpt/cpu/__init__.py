"""CPU speed code a reader of the model can skip: linear layers through oneDNN on packed weights
(kernels.py) and the cached decode step written flat (fused_step.py)."""
