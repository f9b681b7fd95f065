#!/usr/bin/python3
"""Trains a model's MTP draft head on the model's own outputs (self-distillation).

Inputs: DATA from `pulse distill collect` (tokens, the main model's final hidden state at every
position) and HEAD from `pulse distill export-head` (the block's tensors as f32 .npy, head.json,
and the decoder's own logits for a check sequence). Output in OUT:
  NAME.npy            the trained block tensors (GGUF names): `pulse distill import-head` puts
                      them back into the GGUF, quantized like the rest
  mtp.safetensors     the same block under the key names of a Qwen3.5 / Qwen3-Next checkpoint
                      (mtp.fc, mtp.pre_fc_norm_*, mtp.layers.0.*, mtp.norm), which vLLM's MTP
                      loader reads; norms stored as the checkpoint keeps them (GGUF weight - 1)
  loss.csv, loss.svg  train and held-out loss and held-out top-1 agreement per epoch
  report.json         the settings, sizes and final numbers
The block kept is the epoch's with the best held-out top-1 agreement (then the lower held-out
loss): with little data, later epochs fit the training rows and drift on the held-out ones.

The block is the decoder's (docs/DECODER.md, "The MTP block"): token p and the hidden state of
p-1 in, normed and concatenated, projected (eh_proj), one gated full-attention layer with its
own causal cache (q/k RMS norms, NeoX partial RoPE), a SwiGLU FFN, the head norm and the head.
Before training, the script runs the exported check sequence and stops unless its logits match
the decoder's. The loss is the cross-entropy against the main model's own next-token
distribution at p+1 (its logits are the head applied to the hidden state there: soft targets,
at every position). The embedding, head and head norm stay fixed (they are the main model's or
its copies); everything else trains with Adam. Sequences are split into training and held-out
sets before anything is trained.

Needs Debian's python3-torch and python3-numpy only. Debian's torch does its matrix products through
the system BLAS: with libopenblas0-pthread installed they run ~20x faster than with the reference
BLAS it falls back to (measured here on one thread: 70 against 3.8 GFLOP/s).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F


def rms(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


class Block(torch.nn.Module):
    """The MTP block over whole sequences (positions 0..N-1, causal)."""

    def __init__(self, cfg, tensors, tables):
        super().__init__()
        self.cfg = cfg
        b = "blk.%d." % cfg["block"]
        self.names = {}  # parameter name -> GGUF name
        for gguf_name, arr in tensors.items():
            short = gguf_name[len(b):].replace(".", "_")
            self.register_parameter(short, torch.nn.Parameter(torch.from_numpy(arr.copy())))
            self.names[short] = gguf_name
        for key, arr in tables.items():
            self.register_buffer(key, torch.from_numpy(arr.copy()))
        D, R = cfg["head_dim"], cfg["rope_dim"]
        self.scale = cfg["attn_scale"] if cfg["attn_scale"] > 0 else 1.0 / math.sqrt(D)
        inv = torch.tensor([cfg["rope_base"] ** (-2.0 * i / R) for i in range(R // 2)], dtype=torch.float64)
        self.register_buffer("inv_freq", inv)

    def p(self, name):
        return getattr(self, name)

    def rope(self, x, pos):
        # x: [N, heads, D]; NeoX pairs (i, i + R/2) over the first R dims.
        R = self.cfg["rope_dim"]
        theta = pos[:, None].double() * self.inv_freq[None, :]
        c, s = torch.cos(theta).float()[:, None, :], torch.sin(theta).float()[:, None, :]
        a, b = x[..., : R // 2], x[..., R // 2 : R]
        return torch.cat([a * c - b * s, a * s + b * c, x[..., R:]], dim=-1)

    def forward(self, tokens, hidden_in):
        """tokens [N] int64, hidden_in [N, E] (row p: the main hidden state of p-1) -> logits [N, V]."""
        cfg, eps = self.cfg, self.cfg["rms_eps"]
        N, H, Hkv, D = tokens.shape[0], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
        e = rms(self.embed[tokens], self.p("nextn_enorm_weight"), eps)
        h = rms(hidden_in, self.p("nextn_hnorm_weight"), eps)
        x = torch.cat([e, h], dim=-1) @ self.p("nextn_eh_proj_weight").T
        a = rms(x, self.p("attn_norm_weight"), eps)
        qg = (a @ self.p("attn_q_weight").T).view(N, H, 2 * D)
        q, gate = qg[..., :D], qg[..., D:]
        k = (a @ self.p("attn_k_weight").T).view(N, Hkv, D)
        v = (a @ self.p("attn_v_weight").T).view(N, Hkv, D)
        pos = torch.arange(N)
        q = self.rope(rms(q, self.p("attn_q_norm_weight"), eps), pos) * self.scale
        k = self.rope(rms(k, self.p("attn_k_norm_weight"), eps), pos)
        G = H // Hkv
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # query head j reads KV head j // G
        scores = torch.einsum("nhd,mhd->hnm", q, k)
        scores = scores.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hnm,mhd->nhd", torch.softmax(scores, dim=-1), v) * torch.sigmoid(gate)
        x = x + o.reshape(N, H * D) @ self.p("attn_output_weight").T
        f = rms(x, self.p("post_attention_norm_weight"), eps)
        x = x + (F.silu(f @ self.p("ffn_gate_weight").T) * (f @ self.p("ffn_up_weight").T)) @ self.p("ffn_down_weight").T
        norm = self.p("nextn_shared_head_norm_weight") if hasattr(self, "nextn_shared_head_norm_weight") else self.head_norm
        return rms(x, norm, eps) @ self.head.T


def load_head(head_dir):
    cfg = json.load(open(os.path.join(head_dir, "head.json")))
    tensors = {t["name"]: np.load(os.path.join(head_dir, t["name"] + ".npy")).astype(np.float32) for t in cfg["tensors"]}
    tables = {k: np.load(os.path.join(head_dir, k + ".npy")).astype(np.float32) for k in ("embed", "head", "head_norm")}
    return cfg, tensors, tables


def check(block, head_dir):
    """The largest logit difference to the decoder's, the largest logit, and the share of rows with
    the decoder's top token among the rows whose top two are further apart than the tolerance
    allows to swap (the decoder keeps its KV cache in f16: near-ties may flip)."""
    tokens = torch.from_numpy(np.load(os.path.join(head_dir, "check_tokens.npy")).astype(np.int64))
    hidden = torch.from_numpy(np.load(os.path.join(head_dir, "check_hidden_in.npy")))
    want = torch.from_numpy(np.load(os.path.join(head_dir, "check_logits.npy")))
    with torch.no_grad():
        got = block(tokens, hidden)
    worst = (got - want).abs().max().item()
    spread = want.abs().max().item()
    top2 = want.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * tolerance(spread)
    same = got.argmax(-1) == want.argmax(-1)
    same_top = same[decided].float().mean().item() if decided.any() else 1.0
    return worst, spread, same_top


def tolerance(spread):
    return 1e-3 * max(spread, 1.0)


def sequences(data_dir, E):
    """The data's sequences as (tokens, hidden, prompt key): sampled continuations of one prompt
    share the key, so that the held-out split keeps them together."""
    tokens = np.load(os.path.join(data_dir, "tokens.npy")).astype(np.int64)
    hidden = np.load(os.path.join(data_dir, "hidden.npy"), mmap_mode="r")
    starts = np.load(os.path.join(data_dir, "starts.npy"))
    generated_from = np.load(os.path.join(data_dir, "generated_from.npy"))
    if hidden.shape[1] != E:
        sys.exit("train: the data's hidden states have %d values, the head's model %d: collected from another model" % (hidden.shape[1], E))
    out = []
    for s in range(len(starts) - 1):
        a, b = int(starts[s]), int(starts[s + 1])
        if b - a >= 3:
            out.append((tokens[a:b], np.array(hidden[a:b], dtype=np.float32), tokens[a:int(generated_from[s])].tobytes()))
    return out


def split(seqs, share, seed):
    """Held-out and training sequences, split by prompt."""
    keys = sorted({s[2] for s in seqs})
    order = np.random.default_rng(seed).permutation(len(keys))
    n_held = max(1, int(round(len(keys) * share)))
    held_keys = {keys[i] for i in order[:n_held]}
    return [s for s in seqs if s[2] in held_keys], [s for s in seqs if s[2] not in held_keys]


def batch(seq, head):
    """Row p: token p and the main hidden state of p-1 in (zeros at 0); the target is the main
    model's distribution for token p+1, its head applied to its hidden state at p."""
    toks, hid = seq[0], seq[1]
    h = torch.from_numpy(hid)
    hidden_in = torch.cat([torch.zeros(1, h.shape[1]), h[:-1]], dim=0)
    return torch.from_numpy(toks), hidden_in, h @ head.T


def evaluate(block, seqs):
    loss, agree, rows = 0.0, 0, 0
    with torch.no_grad():
        for seq in seqs:
            t, h, teacher = batch(seq, block.head)
            logits = block(t, h)
            loss += F.cross_entropy(logits, torch.softmax(teacher, -1), reduction="sum").item()
            agree += (logits.argmax(-1) == teacher.argmax(-1)).sum().item()
            rows += t.shape[0]
    return loss / max(rows, 1), agree / max(rows, 1)


def repeat_baseline(seqs, head):
    """How predictable the text is: how often the main model's next token is the current one
    (what a drafter that only repeats would get right)."""
    same, rows = 0, 0
    for seq in seqs:
        t, _, teacher = batch(seq, head)
        same += (teacher.argmax(-1) == t).sum().item()
        rows += t.shape[0]
    return same / max(rows, 1)


def write_svg(path, rows):
    """Train and held-out loss per epoch as a plain SVG line chart."""
    W, Hh, m = 640, 360, 50
    ys = [r[1] for r in rows] + [r[2] for r in rows]
    lo, hi = min(ys), max(ys)
    hi = hi if hi > lo else lo + 1
    n = max(len(rows) - 1, 1)
    def pt(i, y):
        return "%.1f,%.1f" % (m + (W - 2 * m) * i / n, Hh - m - (Hh - 2 * m) * (y - lo) / (hi - lo))
    lines = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, Hh),
             '<rect width="100%" height="100%" fill="white"/>',
             '<text x="%d" y="20">MTP head self-distillation: loss per epoch</text>' % m,
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (m, Hh - m, W - m, Hh - m),
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>' % (m, m, m, Hh - m),
             '<text x="%d" y="%d">%.3f</text>' % (4, m + 4, hi), '<text x="%d" y="%d">%.3f</text>' % (4, Hh - m, lo),
             '<text x="%d" y="%d">epoch %d</text>' % (W - m - 40, Hh - m + 20, rows[-1][0])]
    for col, color, label in ((1, "#1f77b4", "train"), (2, "#d62728", "held-out")):
        lines.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (color, " ".join(pt(i, r[col]) for i, r in enumerate(rows))))
        lines.append('<text x="%d" y="%d" fill="%s">%s</text>' % (W - m - 60, m + 16 * col, color, label))
    lines.append("</svg>")
    open(path, "w").write("\n".join(lines) + "\n")


def write_safetensors(path, block):
    """The block under a Qwen3.5 checkpoint's key names (vLLM's Qwen3_5MTP / Qwen3NextMTP loaders)."""
    rename = {
        "nextn.eh_proj.weight": "mtp.fc.weight",
        "nextn.enorm.weight": "mtp.pre_fc_norm_embedding.weight",
        "nextn.hnorm.weight": "mtp.pre_fc_norm_hidden.weight",
        "nextn.shared_head_norm.weight": "mtp.norm.weight",
        "attn_norm.weight": "mtp.layers.0.input_layernorm.weight",
        "post_attention_norm.weight": "mtp.layers.0.post_attention_layernorm.weight",
        "attn_q.weight": "mtp.layers.0.self_attn.q_proj.weight",
        "attn_k.weight": "mtp.layers.0.self_attn.k_proj.weight",
        "attn_v.weight": "mtp.layers.0.self_attn.v_proj.weight",
        "attn_output.weight": "mtp.layers.0.self_attn.o_proj.weight",
        "attn_q_norm.weight": "mtp.layers.0.self_attn.q_norm.weight",
        "attn_k_norm.weight": "mtp.layers.0.self_attn.k_norm.weight",
        "ffn_gate.weight": "mtp.layers.0.mlp.gate_proj.weight",
        "ffn_up.weight": "mtp.layers.0.mlp.up_proj.weight",
        "ffn_down.weight": "mtp.layers.0.mlp.down_proj.weight",
    }
    prefix = "blk.%d." % block.cfg["block"]
    arrays = {}
    for short, gguf_name in block.names.items():
        tail = gguf_name[len(prefix):]
        if tail not in rename:
            continue  # nextn.embed_tokens / shared_head_head: the checkpoint's embed_tokens and lm_head
        a = block.p(short).detach().numpy().astype(np.float32)
        if tail.endswith("norm.weight"):
            a = a - 1.0  # the checkpoint's Gemma-style norms: GGUF converters add 1
        arrays[rename[tail]] = np.ascontiguousarray(a)
    header, offset = {"__metadata__": {"format": "pt", "source": "pulse tools/distill/train.py"}}, 0
    for k in sorted(arrays):
        n = arrays[k].nbytes
        header[k] = {"dtype": "F32", "shape": list(arrays[k].shape), "data_offsets": [offset, offset + n]}
        offset += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for k in sorted(arrays):
            f.write(arrays[k].tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="pulse distill collect's output")
    ap.add_argument("--head", required=True, help="pulse distill export-head's output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--held-out", type=float, default=0.2, help="share of prompts whose sequences are kept out of training")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="0: one per CPU")
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    # torch may start with one thread whatever the machine has; 0 means all of them.
    torch.set_num_threads(a.threads if a.threads > 0 else (os.cpu_count() or 1))
    cfg, tensors, tables = load_head(a.head)
    block = Block(cfg, tensors, tables)
    worst, spread, same_top = check(block, a.head)
    print("check against the decoder's block: max |logit difference| %.2e (logits up to %.2f), same top token %.0f%% (rows not tied)" % (worst, spread, 100 * same_top))
    if worst > tolerance(spread) or same_top < 1.0:
        sys.exit("train: this block does not compute what the decoder's does; not training it")
    seqs = sequences(a.data, cfg["n_embd"])
    if len(seqs) < 2:
        sys.exit("train: need at least 2 sequences of 3 or more tokens in %s" % a.data)
    held, train = split(seqs, a.held_out, a.seed)
    if not train:
        sys.exit("train: every prompt went to the held-out set: need at least 2 prompts in %s" % a.data)
    opt = torch.optim.Adam([p for p in block.parameters()], lr=a.lr)
    os.makedirs(a.out, exist_ok=True)
    before = evaluate(block, held)
    rows = [(0, evaluate(block, train)[0], before[0], before[1])]
    print("epoch %d: train %.4f held-out %.4f top-1 %.3f" % rows[0])
    best = (0, before[1], before[0], {k: v.detach().clone() for k, v in block.named_parameters()})
    t0 = time.time()
    for epoch in range(1, a.epochs + 1):
        total, n = 0.0, 0
        for i in np.random.default_rng(a.seed + epoch).permutation(len(train)):
            t, h, teacher = batch(train[i], block.head)
            loss = F.cross_entropy(block(t, h), torch.softmax(teacher, -1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * t.shape[0]
            n += t.shape[0]
        held_loss, held_top1 = evaluate(block, held)
        rows.append((epoch, total / n, held_loss, held_top1))
        print("epoch %d: train %.4f held-out %.4f top-1 %.3f" % rows[-1])
        if (held_top1, -held_loss) > (best[1], -best[2]):
            best = (epoch, held_top1, held_loss, {k: v.detach().clone() for k, v in block.named_parameters()})
    # The epoch whose block agreed best with the main model on held-out rows: later epochs
    # may only fit the training rows better (the held-out loss rising again).
    with torch.no_grad():
        for k, v in block.named_parameters():
            v.copy_(best[3][k])
    print("kept epoch %d: held-out top-1 %.3f, loss %.4f" % best[:3])
    for short, gguf_name in block.names.items():
        np.save(os.path.join(a.out, gguf_name + ".npy"), block.p(short).detach().numpy().astype(np.float32))
    write_safetensors(os.path.join(a.out, "mtp.safetensors"), block)
    with open(os.path.join(a.out, "loss.csv"), "w") as f:
        f.write("epoch,train_loss,heldout_loss,heldout_top1\n")
        for r in rows:
            f.write("%d,%.6f,%.6f,%.6f\n" % r)
    write_svg(os.path.join(a.out, "loss.svg"), rows)
    report = {"model": cfg["model"], "sequences": {"train": len(train), "held_out": len(held)},
              "rows": {"train": int(sum(len(s[0]) for s in train)), "held_out": int(sum(len(s[0]) for s in held))},
              "epochs": a.epochs, "lr": a.lr, "seed": a.seed, "seconds": round(time.time() - t0, 2),
              "check": {"max_abs_logit_diff": worst, "same_top": same_top},
              "held_out_repeat_baseline": repeat_baseline(held, block.head),
              "held_out_before": {"loss": before[0], "top1": before[1]},
              "kept_epoch": best[0],
              "held_out_after": {"loss": best[2], "top1": best[1]}}
    json.dump(report, open(os.path.join(a.out, "report.json"), "w"), indent=1)
    print("wrote %s: held-out top-1 agreement %.3f -> %.3f (epoch %d)" % (a.out, before[1], best[1], best[0]))


if __name__ == "__main__":
    main()
