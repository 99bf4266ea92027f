"""A third-party-style training script shaped like karpathy/nanoGPT's train.py: module-level
globals overridden by `exec(configurator.py)` from `--key=value` arguments, DDP when launched
by torchrun (gloo here), no tuner import. Unpatched (`--patched=False`), every configuration
dies on the same AttributeError after the process group is up, on every rank, as an
unpatched nanoGPT did under tuner (issue 44, item 1). Patched, it trains a tiny model on
random tokens, reports each "epoch" (eval interval) with the stdout line, and writes its
checkpoint where `out_dir` says (`{trial_dir}` in a sweep).
"""

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed import all_reduce, destroy_process_group, init_process_group

out_dir = "out"
eval_interval = 2
max_iters = 4
learning_rate = 1e-2
n_embd = 8
backend = "gloo"
patched = False
config_keys = [
    k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configurator.py")).read())
config = {k: globals()[k] for k in config_keys}


@dataclass
class GPTConfig:
    block_size: int = 8
    vocab_size: int = 16
    n_embd: int = 8


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    init_process_group(backend=backend)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
else:
    rank, world = 0, 1
torch.manual_seed(1337 + rank)
gptconf = GPTConfig(n_embd=n_embd)
if not patched:
    use_flash = gptconf.flash  # noqa: F841  (the bug: GPTConfig has no such field)
model = torch.nn.Sequential(
    torch.nn.Embedding(gptconf.vocab_size, gptconf.n_embd),
    torch.nn.Linear(gptconf.n_embd, gptconf.vocab_size),
)
opt = torch.optim.SGD(model.parameters(), lr=learning_rate)
tokens = torch.Generator().manual_seed(0)
data = torch.randint(0, gptconf.vocab_size, (64, gptconf.block_size + 1), generator=tokens)
for it in range(1, max_iters + 1):
    x, y = data[:, :-1], data[:, 1:]
    loss = F.cross_entropy(model(x).reshape(-1, gptconf.vocab_size), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    if ddp:
        for p in model.parameters():
            all_reduce(p.grad)
            p.grad /= world
    opt.step()
    if it % eval_interval == 0 and rank == 0:
        os.makedirs(out_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(out_dir, "ckpt.pt"))
        print(f'TUNER_REPORT {{"epoch": {it // eval_interval}, "val_loss": {loss.item()!r}}}', flush=True)
if ddp:
    destroy_process_group()
