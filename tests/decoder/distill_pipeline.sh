#!/bin/bash
# The self-distillation pipeline end to end on the demo model (tools/distill/run): the trainer's
# block reproduces the decoder's, training raises held-out agreement and the draft acceptance
# `pulse bench accept` measures through a gateway, the exports hold what vLLM and the decoder
# load, and bad inputs stop each step with a clear error.
# usage: distill_pipeline.sh PULSE_EXE PLUGIN_DIR SOURCE_ROOT
set -euo pipefail
pulse=$1 plugins=$2 root=$3
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
    [ -n "${PULSE_REQUIRE_E2E:-}" ] && { echo "FAIL: python3-torch / python3-numpy missing (tools/dev installs them)"; exit 1; }
    echo "SKIP: python3-torch / python3-numpy not installed"; exit 77
fi
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# One thread each (torch and the decoder): the suite runs two tests at once on two cores.
"$pulse" gguf make-demo --mtp "$t/demo.gguf" > /dev/null
PULSE=$pulse PULSE_PLUGIN_DIR=$plugins timeout 600 "$root/tools/distill/run" "$t/demo.gguf" "$t/out" -n 48 --epochs 6 --max-tokens 32 --threads 1 --draft-vocab 48 \
    > "$t/run.log" 2>&1 || { cat "$t/run.log"; fail "tools/distill/run failed"; }
tail -1 "$t/run.log"
grep -q "check against the decoder's block: max |logit difference|" "$t/run.log" || fail "no check line"

/usr/bin/python3 - "$t/out" <<'EOF'
import json, struct, sys
import numpy as np
out = sys.argv[1]
s = json.load(open(out + "/summary.json"))
tr, acc = s["training"], s["acceptance"]
print("held-out top-1 %.3f -> %.3f; acceptance %.3f -> %.3f, %.3f within the draft vocabulary" % (tr["held_out_before"]["top1"], tr["held_out_after"]["top1"],
      acc["before"]["rate"], acc["after"]["rate"], acc["after-vocab"]["rate"]))
assert tr["sequences"]["held_out"] >= 1 and tr["sequences"]["train"] > tr["sequences"]["held_out"], tr["sequences"]
assert tr["check"]["same_top"] == 1.0 and tr["check"]["max_abs_logit_diff"] < 1e-3, tr["check"]
assert tr["held_out_after"]["loss"] < tr["held_out_before"]["loss"], "held-out loss did not fall"
assert tr["held_out_after"]["top1"] > tr["held_out_before"]["top1"] + 0.3, "held-out agreement did not rise"
assert 1 <= tr["kept_epoch"] <= tr["epochs"], tr["kept_epoch"]
assert acc["before"]["draft_tokens"] > 0 and acc["after"]["draft_tokens"] > 0, acc
assert acc["after"]["rate"] > acc["before"]["rate"] + 0.3, "acceptance did not rise"
# The draft vocabulary: the 48 tokens generated most, most frequent first; drafting within them
# keeps most of the acceptance (the demo's text is a few tokens repeated).
vocab = [l.split() for l in open(out + "/vocab.txt") if not l.startswith("#")]
counts = [int(c) for _, c in vocab]
assert 1 < len(vocab) <= 48 and counts == sorted(counts, reverse=True), vocab
assert acc["after-vocab"]["draft_tokens"] > 0 and acc["after-vocab"]["rate"] > acc["after"]["rate"] - 0.15, acc
assert "drafting among the %d tokens of" % len(vocab) in open(out + "/serve-after-vocab.log").read()
lines = open(out + "/trained/loss.csv").read().split()
assert lines[0] == "epoch,train_loss,heldout_loss,heldout_top1" and len(lines) == 1 + 7, lines
assert "<polyline" in open(out + "/trained/loss.svg").read()
# The vLLM shard: a checkpoint's key names, [out, in] shapes, norms as the checkpoint keeps them.
raw = open(out + "/trained/mtp.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
head = json.load(open(out + "/head/head.json"))
E, H, D = head["n_embd"], head["n_head"], head["head_dim"]
want = {"mtp.fc.weight": [E, 2 * E], "mtp.pre_fc_norm_embedding.weight": [E], "mtp.pre_fc_norm_hidden.weight": [E], "mtp.norm.weight": [E],
        "mtp.layers.0.input_layernorm.weight": [E], "mtp.layers.0.post_attention_layernorm.weight": [E],
        "mtp.layers.0.self_attn.q_proj.weight": [2 * H * D, E], "mtp.layers.0.self_attn.o_proj.weight": [E, H * D],
        "mtp.layers.0.self_attn.q_norm.weight": [D], "mtp.layers.0.mlp.down_proj.weight": [E, head["n_ff"]]}
for k, shape in want.items():
    assert k in header and header[k]["shape"] == shape and header[k]["dtype"] == "F32", (k, header.get(k))
def tensor(k):
    a, b = header[k]["data_offsets"]
    return np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(header[k]["shape"])
b = "blk.%d." % head["block"]
assert np.allclose(tensor("mtp.norm.weight") + 1, np.load(out + "/trained/" + b + "nextn.shared_head_norm.weight.npy"))
assert np.array_equal(tensor("mtp.fc.weight"), np.load(out + "/trained/" + b + "nextn.eh_proj.weight.npy"))
EOF

# The imported file: the block is there, and greedy output with its drafts is plain greedy output.
"$pulse" gguf info "$t/out/trained.gguf" | grep -q "MTP block: 1 at blk" || fail "the trained file has no MTP block"
ids() { /usr/bin/python3 -c 'import json, sys; print([t["id"] for t in json.load(sys.stdin)["tokens"]])'; }
plain=$("$pulse" decode "$t/out/trained.gguf" --prompt "def fib(n):" -n 40 --json --exact | ids)
drafted=$("$pulse" decode "$t/out/trained.gguf" --prompt "def fib(n):" -n 40 --json --exact --draft mtp --draft-k 4 | ids)
[ "$plain" = "$drafted" ] || fail "drafted output differs: $plain vs $drafted"

# Unhappy paths.
"$pulse" gguf make-demo "$t/plain.gguf" > /dev/null
out=$("$pulse" distill export-head "$t/plain.gguf" --out "$t/x" 2>&1) && fail "export-head of a file without a block succeeded"
grep -q "no MTP block to train" <<< "$out" || fail "export-head: $out"
cp -r "$t/out/head" "$t/bad-head"
/usr/bin/python3 -c "import numpy as np; p='$t/bad-head/check_logits.npy'; a=np.load(p); a[3, 5] += 1.0; np.save(p, a)"
out=$(/usr/bin/python3 "$root/tools/distill/train.py" --data "$t/out/data" --head "$t/bad-head" --out "$t/y" --epochs 1 2>&1) && fail "train.py trained a block that fails its check"
grep -q "does not compute what the decoder's does" <<< "$out" || fail "train.py: $out"
cp -r "$t/out/trained" "$t/bad-trained"
/usr/bin/python3 -c "import numpy as np; np.save('$t/bad-trained/blk.2.nextn.eh_proj.weight.npy', np.zeros((3, 3), np.float32))"
out=$("$pulse" distill import-head "$t/demo.gguf" --head "$t/bad-trained" --out "$t/z.gguf" 2>&1) && fail "import-head took a misshapen tensor"
grep -q "shape does not match blk.2.nextn.eh_proj.weight" <<< "$out" || fail "import-head: $out"
echo "ok"
