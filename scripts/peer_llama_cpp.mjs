// llama.cpp as a peer on the same GGUF: plain greedy decoding, its prompt lookup (node-llama-cpp's
// InputLookupTokenPredictor) and, given a draft GGUF, its draft-model speculation (DraftSequenceTokenPredictor,
// its defaults: up to 16 tokens, minimum confidence 0.6), per prompt, interleaved, on the CPU with a fixed thread
// count.
//
//   npm install node-llama-cpp@3.21.1      (in any directory; run this script from there)
//   node scripts/peer_llama_cpp.mjs MODEL.gguf PROMPTS.jsonl MAX_TOKENS ROUNDS THREADS [DRAFT.gguf] > out.jsonl
//
// Each line printed: {"round", "prompt", "mode", "tokens", "seconds", "text", "accepted", "drafted"}; seconds cover
// the whole completion (the prompts are short, so prefill is a small share), as mlxspec's bench times a run.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

const require = createRequire(process.cwd() + "/");
const { getLlama, LlamaCompletion, InputLookupTokenPredictor, DraftSequenceTokenPredictor } = await import(
  require.resolve("node-llama-cpp")
);

const [modelPath, promptsFile, maxTokensArg, roundsArg, threadsArg, draftPath] = process.argv.slice(2);
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
const draftModel = draftPath ? await llama.loadModel({ modelPath: draftPath }) : null;
const draftContext = draftModel ? await draftModel.createContext({ contextSize: 2048, threads, sequences: 1 }) : null;
const modesOf = draftModel ? ["plain", "lookup", "draft"] : ["plain", "lookup"];

function predictor(mode) {
  if (mode === "lookup") return new InputLookupTokenPredictor();
  if (mode === "draft") return new DraftSequenceTokenPredictor(draftContext.getSequence());
  return null;
}

async function run(prompt, mode) {
  const tokenPredictor = predictor(mode);
  const options = tokenPredictor ? { tokenPredictor } : {};
  const sequence = context.getSequence(options);
  const completion = new LlamaCompletion({ contextSequence: sequence });
  const started = performance.now();
  const text = await completion.generateCompletion(prompt, { maxTokens, temperature: 0 });
  const seconds = (performance.now() - started) / 1000;
  const stats = sequence.tokenPredictions ?? {};
  const tokens = model.tokenize(text, false).length;
  sequence.dispose();
  if (mode === "draft" && !tokenPredictor.draftSequence.disposed) tokenPredictor.draftSequence.dispose();
  return { tokens, seconds, text, accepted: stats.validated ?? null, drafted: (stats.validated ?? 0) + (stats.refuted ?? 0) };
}

await run(prompts[0], "plain"); // warm-up: page the weights in, start the threads
for (let round = 0; round < rounds; round++) {
  for (let i = 0; i < prompts.length; i++) {
    const shift = (round + i) % modesOf.length; // interleaved, each mode first in turn
    const modes = [...modesOf.slice(shift), ...modesOf.slice(0, shift)];
    for (const mode of modes) {
      const result = await run(prompts[i], mode);
      console.log(JSON.stringify({ round, prompt: i, mode, ...result }));
    }
  }
}
await context.dispose();
await model.dispose();
if (draftModel) {
  await draftContext.dispose();
  await draftModel.dispose();
}
