"""Training: what train.py and rl.py share to train a model.

Its config (train_config), how a run starts (startup, resume, notes), its batches, optimizers and schedule,
its processes under torchrun (distributed, sharding), how it stops, what it logs (metrics) and the lm-eval
tasks it scores as it goes (train_tasks). A reader of model.py and train.py can skip it.
"""
