"""Train a small character-level transformer language model whose attention is flashattn_ext.

The model is a GPT-style decoder: learned token and position embeddings, pre-LayerNorm blocks of
causal self-attention and a GELU MLP, a final LayerNorm and a head tied to the token embedding.
Attention is flashattn_ext.nn.Attention(causal=True): a fused qkv projection whose (B, S, H, D) views
go to flashattn_ext.flash_attn_func with no transpose and no copy (`--attn sdpa`: the same module
with torch.nn.functional.scaled_dot_product_attention as its core, on (B, H, S, D) transposed views;
same parameters, same initial weights).

Data: examples/data/shakespeare.txt (Macbeth and The Tempest), 90 % train / 10 % validation.
On a GPU the model trains in bf16 autocast; on the CPU in fp32 (the default size runs 300 steps in
about a minute on 2 cores). The run evaluates the validation loss before and after training,
prints a sample, and exits with status 1 unless the final loss is clearly below the initial one.

    python examples/train_lm.py                      # 300 steps, GPU if there is one
    python examples/train_lm.py --device cpu --steps 100 --attn sdpa
"""
import argparse
import math
import pathlib
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from flashattn_ext.nn import Attention

DATA_PATH = pathlib.Path(__file__).resolve().parent / "data" / "shakespeare.txt"
VAL_FRACTION = 0.1
EVAL_BATCHES = 8
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
MIN_LR_FRACTION = 0.1
WEIGHT_DECAY = 0.1
GRAD_CLIP = 1.0
INIT_STD = 0.02
MLP_RATIO = 4
SAMPLE_CHARS = 300
SAMPLE_TEMPERATURE = 0.8
SAMPLE_PROMPT = "MACBETH.\n"
# The demo fails unless final validation loss <= this fraction of the initial one. An untrained
# model scores ln(vocab) ~ 4.3 nats; even the unigram character distribution scores ~3.1.
REQUIRED_LOSS_RATIO = 0.8


class CharDataset:
    """The text as one long tensor of character ids, split into train and validation parts."""

    def __init__(self, path=DATA_PATH):
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.index[c] for c in text], dtype=torch.long)
        n_val = int(len(ids) * VAL_FRACTION)
        self.train, self.val = ids[:-n_val], ids[-n_val:]

    @property
    def vocab_size(self):
        return len(self.chars)

    def encode(self, text):
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids.tolist())

    def batch(self, split, batch, seq, generator, device):
        """Random windows: inputs x (batch, seq) and next-character targets y (batch, seq)."""
        data = self.train if split == "train" else self.val
        starts = torch.randint(len(data) - seq - 1, (batch,), generator=generator)
        x = torch.stack([data[s:s + seq] for s in starts])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts])
        return x.to(device), y.to(device)


class TorchSDPAAttention(Attention):
    """flashattn_ext.nn.Attention with torch's scaled_dot_product_attention as its core (--attn sdpa)."""

    def attend(self, q, k, v, attn_mask=None):  # (B, S, H, D) views -> (B, S, H, D)
        return F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, is_causal=self.causal
        ).transpose(1, 2)


ATTENTION = {"flashattn_ext": Attention, "sdpa": TorchSDPAAttention}


class Block(nn.Module):
    def __init__(self, dmodel, heads, attn):
        super().__init__()
        self.ln1 = nn.LayerNorm(dmodel)
        self.attn = ATTENTION[attn](dmodel, heads, causal=True)
        self.ln2 = nn.LayerNorm(dmodel)
        self.mlp = nn.Sequential(
            nn.Linear(dmodel, MLP_RATIO * dmodel), nn.GELU(), nn.Linear(MLP_RATIO * dmodel, dmodel)
        )

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab_size, seq, layers, dmodel, heads, attn):
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab_size, dmodel)
        self.pos = nn.Embedding(seq, dmodel)
        self.blocks = nn.ModuleList(Block(dmodel, heads, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dmodel)
        self.head = nn.Linear(dmodel, vocab_size, bias=False)
        self.head.weight = self.tok.weight
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=INIT_STD)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx):  # idx: (B, S) character ids -> logits (B, S, vocab)
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def autocast(device):
    """bf16 autocast on a GPU, plain fp32 elsewhere."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def loss_of(model, x, y):
    with autocast(x.device):
        logits = model(x)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def make_model_and_batch(attn="flashattn_ext", device="cpu", batch=16, seq=128, layers=4, dmodel=128,
                         heads=4, seed=0, dataset=None):
    """Model, optimizer and one training batch (x, y), all seeded: the unit the benchmarks time."""
    device = torch.device(device)
    dataset = dataset or CharDataset()
    torch.manual_seed(seed)
    model = CharTransformer(dataset.vocab_size, seq, layers, dmodel, heads, attn).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LEARNING_RATE, betas=(0.9, 0.95), fused=device.type == "cuda",
    )
    x, y = dataset.batch("train", batch, seq, torch.Generator().manual_seed(seed), device)
    return model, optimizer, (x, y)


def train_step(model, optimizer, x, y):
    """One optimizer step on batch (x, y); returns the loss as a 0-d tensor (no host sync)."""
    loss = loss_of(model, x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    return loss.detach()


def learning_rate(step, steps):
    """Linear warm-up, then cosine decay to MIN_LR_FRACTION of the peak."""
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LEARNING_RATE * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, dataset, batch, seq, device, seed):
    """Mean validation loss over EVAL_BATCHES fixed batches (the same batches on every call)."""
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    losses = [loss_of(model, *dataset.batch("val", batch, seq, generator, device)).item()
              for _ in range(EVAL_BATCHES)]
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def sample(model, dataset, device, seed, chars=SAMPLE_CHARS, prompt=SAMPLE_PROMPT):
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    idx = dataset.encode(prompt).to(device)[None]
    for _ in range(chars):
        with autocast(device):
            logits = model(idx[:, -model.seq:])[0, -1].float()
        probs = torch.softmax(logits / SAMPLE_TEMPERATURE, dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)[None]], dim=1)
    model.train()
    return dataset.decode(idx[0])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--attn", choices=list(ATTENTION), default="flashattn_ext")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--dmodel", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args()

    device = torch.device(args.device)
    dataset = CharDataset()
    model, optimizer, _ = make_model_and_batch(args.attn, device, args.batch, args.seq, args.layers,
                                               args.dmodel, args.heads, args.seed, dataset)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.attn} on {device}: {args.layers} layers, d_model {args.dmodel}, {args.heads} heads, "
          f"context {args.seq}, batch {args.batch}, {n_params / 1e6:.2f} M parameters, "
          f"vocab {dataset.vocab_size}, {len(dataset.train)} training characters")

    initial = evaluate(model, dataset, args.batch, args.seq, device, args.seed)
    print(f"step {0:5d}  val loss {initial:.4f}")
    generator = torch.Generator().manual_seed(args.seed + 1)
    start = window_start = time.perf_counter()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args.steps)
        loss = train_step(model, optimizer, *dataset.batch("train", args.batch, args.seq, generator, device))
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            loss = loss.item()  # syncs, so the window time below is real
            now = time.perf_counter()
            steps_in_window = (step % args.log_every) + 1
            tokens_per_s = steps_in_window * args.batch * args.seq / (now - window_start)
            print(f"step {step + 1:5d}  train loss {loss:.4f}  {tokens_per_s:,.0f} tokens/s")
            window_start = now
    elapsed = time.perf_counter() - start
    final = evaluate(model, dataset, args.batch, args.seq, device, args.seed)
    print(f"step {args.steps:5d}  val loss {final:.4f}  (initial {initial:.4f}, {elapsed:.1f} s training)")
    print("--- sample ---")
    print(sample(model, dataset, device, args.seed))
    print("--------------")
    if not final <= REQUIRED_LOSS_RATIO * initial:
        print(f"FAIL: final val loss {final:.4f} is not below {REQUIRED_LOSS_RATIO} x initial {initial:.4f}")
        sys.exit(1)
    print(f"OK: val loss fell from {initial:.4f} to {final:.4f}")


if __name__ == "__main__":
    main()
