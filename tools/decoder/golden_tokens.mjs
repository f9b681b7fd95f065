// Records llama.cpp's tokenization of a varied text set with the synthetic vocab (byte-level
// BPE, merges, Qwen specials, pre-tokenizer qwen35), for the decoder's tokenizer test.
//   node tools/decoder/golden_tokens.mjs NODE_MODULES_DIR OUT.json MODEL.gguf
import path from "node:path";
import fs from "node:fs";

const [modules, out, file] = process.argv.slice(2);
const { getLlama } = await import(path.join(modules, "node-llama-cpp", "dist", "index.js"));
const llama = await getLlama({ gpu: false, build: "never", logLevel: "error" });
const model = await llama.loadModel({ modelPath: file, vocabOnly: true });

const texts = [
    "Hello world",
    "the cat is in the hat; then there were three.",
    "def main():\n    return parse(argv)\n\n\nif __name__ == '__main__':\n\tmain()\n",
    "   leading and trailing spaces   ",
    "tabs\tand\r\nwindows\r\nlines\n\n\n",
    "numbers 1234567 and 3.14159, 42nd",
    "don't you'll we've I'm she'd THEY'RE It's",
    "émigré naïve café — Zürich, São Paulo, Ångström",
    "日本語のテキストと中文字符和한국어",
    "emoji 😀👍🏽 and symbols ∑∫√ ≠ ≤",
    "mixed\u00a0nbsp and zero\u200bwidth",
    "combining marks: e\u0301 a\u0308 and Hindi नमस्ते",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nhello",
    "<tool_call>\n<function=shell>\n<parameter=cmd>\nls -la\n</parameter>\n</function>\n</tool_call>",
    "a  b   c    d\n \n  \n",
    "x = {'key': [1, 2, 3], \"other\": None}  # comment",
    "",
];
const cases = texts.map((text) => ({ text, ids: Array.from(model.tokenize(text, true)) }));
// And without special-token parsing: control tokens are plain text then.
cases.push({ text: "<|im_start|>plain", ids: Array.from(model.tokenize("<|im_start|>plain", false)), parse_special: false });
fs.writeFileSync(out, `{"generator": "node-llama-cpp tokenize (llama.cpp)", "cases": [\n${cases.map((c) => JSON.stringify(c)).join(",\n")}\n]}\n`);
console.error(`${cases.length} cases`);
