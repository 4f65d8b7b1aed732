// Drives the official OpenAI or Anthropic SDK against a base URL, as a
// user's code would, and prints what the SDK returned or raised as one
// JSON line: sdk_test.go reads it.
//
//   node sdk.mjs '{"sdk":"openai","base":"http://127.0.0.1:8080","model":"gpt-4o","calls":2,"maxRetries":0}'
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";

const o = JSON.parse(process.argv[2]);
const results = [];
const attempts = [];
// Count the attempts the SDK makes (its own retries included), and when.
const start = Date.now();
const countingFetch = (url, init) => {
  attempts.push(Date.now() - start);
  return fetch(url, init);
};
for (let i = 0; i < (o.calls ?? 1); i++) {
  try {
    if (o.sdk === "openai") {
      const client = new OpenAI({ baseURL: o.base + "/v1", apiKey: "sk-test", maxRetries: o.maxRetries ?? 0, fetch: countingFetch,
        defaultHeaders: { "X-Org": "acme" } });
      const { data, response } = await client.chat.completions
        .create({ model: o.model, max_tokens: 50, messages: [{ role: "user", content: "What is the Pythagorean theorem? Answer in one sentence." }] })
        .withResponse();
      results.push({ ok: true, fallback: response.headers.get("cascade-fallback-model"), id: data.id });
    } else {
      const client = new Anthropic({ baseURL: o.base, apiKey: "sk-test", maxRetries: o.maxRetries ?? 0, fetch: countingFetch,
        defaultHeaders: { "X-Org": "acme" } });
      const { data, response } = await client.messages
        .create({ model: o.model, max_tokens: 50, messages: [{ role: "user", content: "What is the Pythagorean theorem? Answer in one sentence." }] })
        .withResponse();
      results.push({ ok: true, fallback: response.headers.get("cascade-fallback-model"), id: data.id });
    }
  } catch (err) {
    results.push({
      ok: false,
      class: err.constructor.name,
      rateLimitError: err instanceof OpenAI.RateLimitError || err instanceof Anthropic.RateLimitError,
      status: err.status,
      requestID: err.requestID ?? null,
      message: err.message,
      code: err.code ?? null,
      type: err.type ?? err.error?.error?.type ?? null,
    });
  }
}
console.log(JSON.stringify({ results, attempts }));
