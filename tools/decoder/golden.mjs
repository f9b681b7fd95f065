// Records llama.cpp's logits and greedy continuations for the synthetic qwen35 files, through
// node-llama-cpp's CPU build (pinned in tools/test-deps/package.json). Output: one JSON per file.
//   node tools/decoder/golden.mjs NODE_MODULES_DIR OUT.json MODEL.gguf [MODEL.gguf ...]
// Each entry: {file, prompt: [ids], logits: [[n_vocab floats] per prompt position], greedy: [32 ids]}.
import path from "node:path";
import fs from "node:fs";

const [modules, out, ...models] = process.argv.slice(2);
if (!modules || !out || models.length === 0) {
    console.error("usage: golden.mjs NODE_MODULES_DIR OUT.json MODEL.gguf...");
    process.exit(2);
}
const { getLlama } = await import(path.join(modules, "node-llama-cpp", "dist", "index.js"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });

// Fixed prompt: <|im_start|>, byte tokens, merged tokens ("Ġt", "Ġthe"), <|im_end|>.
const PROMPT = [297, 72, 101, 108, 108, 111, 256, 258, 32, 119, 111, 114, 108, 100, 10, 298];
const STEPS = 32;

const results = [];
for (const file of models) {
    const model = await llama.loadModel({ modelPath: file });
    const ctx = await model.createContext({ contextSize: 256, batchSize: 64, threads: 2 });
    const seq = ctx.getSequence();
    const nVocab = model.tokens.size ?? model.fileInsights?.vocabularySize;
    const toArray = (m) => {
        const a = new Array(nVocab).fill(null);
        for (const [tok, v] of m) a[tok] = v;
        return a;
    };
    const evals = await seq.controlledEvaluate(PROMPT.map((t) => [t, { generateNext: { logits: true } }]));
    const logits = evals.map((e) => toArray(e.next.logits));
    const greedy = [];
    let last = logits[logits.length - 1];
    for (let i = 0; i < STEPS; ++i) {
        let best = 0;
        for (let t = 1; t < last.length; ++t) if (last[t] > last[best]) best = t;
        greedy.push(best);
        const [r] = await seq.controlledEvaluate([[best, { generateNext: { logits: true } }]]);
        last = toArray(r.next.logits);
    }
    results.push({ file: path.basename(file), prompt: PROMPT, logits: logits.map((l) => l.map((x) => Number(x.toFixed(5)))), greedy });
    await ctx.dispose();
    await model.dispose();
    console.error(`${path.basename(file)}: greedy ${greedy.slice(0, 8).join(",")}...`);
}
fs.writeFileSync(out, JSON.stringify({ generator: "node-llama-cpp (llama.cpp CPU)", steps: STEPS, results }, null, 0) + "\n");
