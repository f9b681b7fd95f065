// llama.cpp's side of tools/bench/decoder: prefill P tokens, then decode N greedily, on the
// CPU with T threads. Prints one JSON line {prefill_tps, decode_tps, tokens}.
//   node tools/decoder/llama_bench.mjs NODE_MODULES_DIR MODEL.gguf THREADS P N
import path from "node:path";

const [modules, file, threads, p, n] = process.argv.slice(2);
const { getLlama } = await import(path.join(modules, "node-llama-cpp", "dist", "index.js"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file });
const P = Number(p), N = Number(n);
const ctx = await model.createContext({ contextSize: P + N + 16, batchSize: Math.max(P, 32), threads: Number(threads) });
const seq = ctx.getSequence();
const vocab = model.tokens.size ?? 300;
const prompt = Array.from({ length: P }, (_, i) => (i * 37 + 11) % Math.min(vocab, 256));
const argmax = (m) => {
    let best = -1, bv = -Infinity;
    for (const [t, v] of m) if (v > bv) (bv = v), (best = t);
    return best;
};
let t0 = performance.now();
const r = await seq.controlledEvaluate(prompt.map((t, i) => (i === P - 1 ? [t, { generateNext: { logits: true } }] : t)));
let t1 = performance.now();
let next = argmax(r[P - 1].next.logits);
const out = [next];
for (let i = 1; i < N; ++i) {
    const [e] = await seq.controlledEvaluate([[next, { generateNext: { logits: true } }]]);
    next = argmax(e.next.logits);
    out.push(next);
}
let t2 = performance.now();
console.log(JSON.stringify({ prefill_tps: (P * 1000) / (t1 - t0), decode_tps: ((N - 1) * 1000) / (t2 - t1), tokens: out }));
await ctx.dispose();
await model.dispose();
