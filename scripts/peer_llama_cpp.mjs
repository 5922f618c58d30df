// llama.cpp as a peer on the same GGUF: plain greedy decoding and its prompt lookup (node-llama-cpp's
// InputLookupTokenPredictor), per prompt, interleaved, on the CPU with a fixed thread count.
//
//   npm install node-llama-cpp@3.21.1      (in any directory; run this script from there with NODE_PATH set)
//   node scripts/peer_llama_cpp.mjs MODEL.gguf PROMPTS.jsonl MAX_TOKENS ROUNDS THREADS > out.jsonl
//
// Each line printed: {"round", "prompt", "mode", "tokens", "seconds", "text", "accepted", "drafted"}; seconds cover
// the whole completion (the prompts are short, so prefill is a small share), as mlxspec's bench times a run.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.cwd() + "/");
const { getLlama, LlamaCompletion, InputLookupTokenPredictor } = await import(require.resolve("node-llama-cpp"));

const [modelPath, promptsFile, maxTokensArg, roundsArg, threadsArg] = process.argv.slice(2);
const maxTokens = Number(maxTokensArg ?? 64);
const rounds = Number(roundsArg ?? 1);
const threads = Number(threadsArg ?? 2);
const prompts = readFileSync(promptsFile, "utf8")
  .split("\n")
  .filter((line) => line.trim())
  .map((line) => JSON.parse(line).prompt);

const llama = await getLlama({ gpu: false, build: "never" });
const model = await llama.loadModel({ modelPath });
const context = await model.createContext({ contextSize: 2048, threads, sequences: 1 });

async function run(prompt, mode) {
  const options = mode === "lookup" ? { tokenPredictor: new InputLookupTokenPredictor() } : {};
  const sequence = context.getSequence(options);
  const completion = new LlamaCompletion({ contextSequence: sequence });
  const started = performance.now();
  const text = await completion.generateCompletion(prompt, { maxTokens, temperature: 0 });
  const seconds = (performance.now() - started) / 1000;
  const stats = sequence.tokenPredictions ?? {};
  const tokens = model.tokenize(text, false).length;
  sequence.dispose();
  return { tokens, seconds, text, accepted: stats.validated ?? null, drafted: (stats.validated ?? 0) + (stats.refuted ?? 0) };
}

await run(prompts[0], "plain"); // warm-up: page the weights in, start the threads
for (let round = 0; round < rounds; round++) {
  for (let i = 0; i < prompts.length; i++) {
    const modes = (round + i) % 2 === 0 ? ["plain", "lookup"] : ["lookup", "plain"]; // interleaved, alternating
    for (const mode of modes) {
      const result = await run(prompts[i], mode);
      console.log(JSON.stringify({ round, prompt: i, mode, ...result }));
    }
  }
}
await context.dispose();
await model.dispose();
