// The official Node `openai` client driving prefixgate: one JSON object of what each call
// returned (or raised) on stdout. Usage: node drive.mjs BASE_URL MODEL EMBEDDING_MODEL
import OpenAI from "openai";

const [baseURL, model, embeddingModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const messages = [
  { role: "system", content: "You are a terse assistant for the order desk." },
  { role: "user", content: "Say hello." },
];
const out = {};

async function step(name, fn) {
  try {
    out[name] = { ok: true, ...(await fn()) };
  } catch (err) {
    out[name] = { ok: false, status: err.status ?? null, type: err.constructor.name,
                  error: err.error ?? null, message: String(err.message) };
  }
}

await step("chat", async () => {
  const { data, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 8 }).withResponse();
  return { content: data.choices[0].message.content, usage: data.usage,
           replica: response.headers.get("x-prefixgate-replica") };
});
await step("chat_stream", async () => {
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 8, stream: true, stream_options: { include_usage: true } });
  let text = "", chunks = 0, usage = null;
  for await (const chunk of stream) {
    chunks += 1;
    text += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) usage = chunk.usage;
  }
  return { content: text, chunks, usage };
});
await step("completion", async () => {
  const data = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 8 });
  return { text: data.choices[0].text, usage: data.usage };
});
await step("embeddings", async () => {
  const data = await client.embeddings.create({ model: embeddingModel, input: ["hello", "world"] });
  return { count: data.data.length, dims: data.data[0].embedding.length, usage: data.usage };
});
await step("models", async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  return { ids };
});
await step("unknown_model", async () => {
  await client.chat.completions.create({ model: "no-such-model", messages, max_tokens: 4 });
  return {};
});
process.stdout.write(JSON.stringify(out) + "\n");
