// Structured output through the agent frameworks clients use, against moonshine-server's
// random-weight model (tests/server/run.sh): LangChain's ChatOpenAI.withStructuredOutput in
// its three methods, and the Vercel AI SDK's generateObject and generateText with
// Output.object, over chat completions and the Responses API. Each test asserts on the
// object the framework parsed and validated with its own zod schema.
// env: BASE (http://127.0.0.1:PORT/v1), MODEL_NAME; prints "N passed, N failed".
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, generateText, Output } from 'ai';
import { z } from 'zod';
import { test, finish } from './harness.mjs';

const { BASE, MODEL_NAME } = process.env;

const Weather = z.object({ city: z.string().max(12), unit: z.enum(['c', 'f']), days: z.number().int() });
const check = (o) => {
  assert.deepEqual(Object.keys(o).sort(), ['city', 'days', 'unit']);
  assert.ok(typeof o.city === 'string' && [...o.city].length <= 12 && ['c', 'f'].includes(o.unit) && Number.isInteger(o.days));
};
const prompt = 'The weather forecast for a city, as JSON.';

await test('LangChain withStructuredOutput: jsonSchema and functionCalling give validated objects; jsonMode a JSON object', async () => {
  const make = (seed) => new ChatOpenAI({ model: MODEL_NAME, apiKey: 'none', configuration: { baseURL: BASE }, temperature: 1, maxTokens: 600,
    maxRetries: 0, modelKwargs: { seed } });
  const llm = make(11);
  for (const method of ['jsonSchema', 'functionCalling']) {
    const o = await llm.withStructuredOutput(Weather, { name: 'weather', method, strict: true }).invoke(prompt);
    check(o);
  }
  // json_object constrains to any JSON object (the schema is only in the prompt): a reply that
  // ends (not cut by the length limit: its strings are unbounded) parses as an object
  let stopped = 0;
  for (let i = 0; i < 4 && !stopped; i++) {
    const r = await make(20 + i).withStructuredOutput(Weather, { name: 'weather', method: 'jsonMode', includeRaw: true }).invoke(prompt);
    if (r.raw.response_metadata.finish_reason !== 'stop') continue;
    const v = JSON.parse(r.raw.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v));
    stopped++;
  }
  assert.ok(stopped, 'no jsonMode reply ended within the limit');
});

await test('Vercel AI SDK generateObject / generateText + Output.object, chat and Responses: validated objects', async () => {
  const provider = createOpenAI({ baseURL: BASE, apiKey: 'none' });
  for (const model of [provider.chat(MODEL_NAME), provider.responses(MODEL_NAME)]) {
    const { object } = await generateObject({ model, schema: Weather, schemaName: 'weather', prompt, maxOutputTokens: 400, maxRetries: 0, seed: 5 });
    check(object);
    const t = await generateText({ model, prompt, maxOutputTokens: 400, maxRetries: 0, seed: 6, experimental_output: Output.object({ schema: Weather }) });
    check(t.experimental_output);
  }
});

finish();
