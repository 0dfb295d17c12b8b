# Fine-tune a small pretrained model on your own conversations (docs/chat.md, "Your own conversations"):
# python data/chat/prepare.py --input my.jsonl --init_from out-shakespeare-char-cpu --out data/my_chat
# python train.py config/chat_sft.py --init_from=out-shakespeare-char-cpu --dataset=data/my_chat --out_dir=out-my-chat
# init_from, dataset and out_dir are yours to give; the model's shape and context are its checkpoint's.
eval_interval = 100
eval_iters = 10  # 10 batches of 16 conversations: a quick, noisy estimate of the answers' loss
log_interval = 25  # each log line syncs
always_save_checkpoint = False  # a few hundred conversations overfit: keep ckpt.pt at the best val loss

gradient_accumulation_steps = 1
batch_size = 16  # conversations per iter, each padded to the batch's longest

learning_rate = 1e-3  # the small pretraining recipes' peak: the model learns a new format, not a nudge
max_iters = 300  # minutes on a laptop for a 0.8M model; raise it for more conversations or a larger model
lr_decay_iters = 300
min_lr = 1e-4  # learning_rate / 10
warmup_iters = 30
beta2 = 0.99  # few tokens per iter: average the second moment over more iters
dropout = 0.0

device = "cpu"
compile = False  # compiling takes longer than the run saves
