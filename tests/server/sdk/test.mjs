// moonshine-server against the official OpenAI Node SDK (tests/server/run.sh starts the servers).
// env: BASE (http://127.0.0.1:PORT/v1 of the sampling server), FORCED_BASE (the server run with
// --test-forced-output), FORCED_EXPECT (the message that output means, by forced_output.py),
// MODEL_NAME, MOONSHINE (the binary), MODEL_DIR; prints "N passed, N failed".
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import { test, finish, promptTokens as harnessPromptTokens } from './harness.mjs';

const { BASE, FORCED_BASE, KDA_BASE, FORCED_EXPECT, MODEL_NAME, MOONSHINE, MODEL_DIR } = process.env;
const client = new OpenAI({ baseURL: BASE, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const model = MODEL_NAME;

const promptTokens = (request) => harnessPromptTokens(MOONSHINE, MODEL_DIR, request);

async function collect(stream) {
  let content = '', reasoning = '', finish = null, usage = null, chunks = 0, role = null;
  const calls = [];
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      const d = ch.delta || {};
      if (d.role) role = d.role;
      if (d.content) content += d.content;
      if (d.reasoning_content) reasoning += d.reasoning_content;
      for (const t of d.tool_calls || []) {
        if (!calls[t.index]) calls[t.index] = { id: t.id, name: '', arguments: '' };
        if (t.function?.name) calls[t.index].name += t.function.name;
        if (t.function?.arguments) calls[t.index].arguments += t.function.arguments;
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, reasoning, finish, usage, chunks, calls, role };
}

const hello = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something about the sea.' }];

await test('models.list', async () => {
  const list = await client.models.list();
  const ids = [];
  for await (const m of list) ids.push(m.id);
  assert.deepEqual(ids, [model]);
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

let greedy;
await test('chat non-stream: usage, length, seed', async () => {
  greedy = await client.chat.completions.create({ model, messages: hello, max_tokens: 12, temperature: 0, seed: 7 });
  const ch = greedy.choices[0];
  assert.equal(ch.message.role, 'assistant');
  assert.equal(typeof ch.message.content, 'string');
  assert.equal(greedy.object, 'chat.completion');
  assert.equal(greedy.usage.prompt_tokens, promptTokens({ messages: hello }));
  // random weights rarely produce <|im_end|> within 12 tokens; when they do the finish is "stop"
  if (ch.finish_reason === 'length') assert.equal(greedy.usage.completion_tokens, 12);
  else assert.equal(ch.finish_reason, 'stop');
  assert.equal(greedy.usage.total_tokens, greedy.usage.prompt_tokens + greedy.usage.completion_tokens);
});

await test('chat stream == non-stream (temperature 0, same seed), usage chunk', async () => {
  const s = await client.chat.completions.create({ model, messages: hello, max_tokens: 12, temperature: 0, seed: 7, stream: true,
                                                   stream_options: { include_usage: true } });
  const r = await collect(s);
  assert.equal(r.role, 'assistant');
  assert.equal(r.content, greedy.choices[0].message.content);
  assert.equal(r.finish, greedy.choices[0].finish_reason);
  assert.deepEqual([r.usage.prompt_tokens, r.usage.completion_tokens], [greedy.usage.prompt_tokens, greedy.usage.completion_tokens]);
  assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0, 'the repeated prompt reuses the cached prefix');
});

await test('sampling: a seed reproduces, another seed differs', async () => {
  const req = { model, messages: hello, max_tokens: 16, temperature: 1.0, top_p: 0.95 };
  const a = await client.chat.completions.create({ ...req, seed: 123 });
  const b = await client.chat.completions.create({ ...req, seed: 123 });
  const c = await client.chat.completions.create({ ...req, seed: 124 });
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
  assert.notEqual(a.choices[0].message.content, c.choices[0].message.content);
});

await test('stop strings cut the text before the match, finish stop', async () => {
  const text = greedy.choices[0].message.content;
  const chars = [...text];
  assert.ok(chars.length >= 6, `greedy text too short: ${JSON.stringify(text)}`);
  const stop = chars.slice(3, 5).join('');
  const want = text.slice(0, text.indexOf(stop));
  const r = await client.chat.completions.create({ model, messages: hello, max_tokens: 12, temperature: 0, stop: [stop, '\u0001never'] });
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collect(await client.chat.completions.create({ model, messages: hello, max_tokens: 12, temperature: 0, stop, stream: true }));
  assert.equal(s.content, want);
  assert.equal(s.finish, 'stop');
});

await test('max_completion_tokens -> finish length', async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Count.' }], max_completion_tokens: 3,
                                                   temperature: 0.8, seed: 5 });
  if (r.choices[0].finish_reason === 'length') assert.equal(r.usage.completion_tokens, 3);
  else assert.ok(r.usage.completion_tokens <= 3);
  assert.ok(r.usage.completion_tokens <= 3);
});

const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather forecast for a city',
                 parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];

await test('tool definitions are rendered into the prompt', async () => {
  const r = await client.chat.completions.create({ model, messages: hello, tools, max_tokens: 1, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, promptTokens({ messages: hello, tools }));
  assert.ok(r.usage.prompt_tokens > greedy.usage.prompt_tokens + 20);
  const none = await client.chat.completions.create({ model, messages: hello, tools, tool_choice: 'none', max_tokens: 1, temperature: 0 });
  assert.equal(none.usage.prompt_tokens, greedy.usage.prompt_tokens);
});

await test('a conversation with assistant tool calls and tool results renders', async () => {
  const messages = [...hello, { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function',
                      function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
                    { role: 'tool', tool_call_id: 'call_1', content: '{"temp": 21}' }];
  const r = await client.chat.completions.create({ model, messages, tools, max_tokens: 2, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, promptTokens({ messages, tools }));
});

await test('completions: prompt text and token ids agree, stream too', async () => {
  const prompt = 'The tide came in over the';
  const ids = JSON.parse(execFileSync(MOONSHINE, ['tokenize', MODEL_DIR], { input: prompt }).toString());
  const a = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0 });
  const b = await client.completions.create({ model, prompt: ids, max_tokens: 8, temperature: 0 });
  assert.equal(a.object, 'text_completion');
  assert.equal(a.choices[0].text, b.choices[0].text);
  assert.equal(a.usage.prompt_tokens, ids.length);
  let text = '', finish = null;
  for await (const c of await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, stream: true })) {
    for (const ch of c.choices) { text += ch.text; if (ch.finish_reason) finish = ch.finish_reason; }
  }
  assert.equal(text, a.choices[0].text);
  assert.equal(finish, a.choices[0].finish_reason);
});

async function expectError(cls, status, fragment, fn, param) {
  try {
    await fn();
  } catch (e) {
    assert.ok(e instanceof cls, `expected ${cls.name}, got ${e && e.constructor && e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    assert.ok(e.message.includes(fragment), `message ${JSON.stringify(e.message)} lacks ${JSON.stringify(fragment)}`);
    if (param !== undefined) assert.equal(e.param, param);
    assert.equal(e.type, status >= 500 ? 'server_error' : 'invalid_request_error');
    return;
  }
  assert.fail('no error was raised');
}

await test('bad requests raise BadRequestError / NotFoundError with the message', async () => {
  await expectError(OpenAI.BadRequestError, 400, "'n' must be 1", () => client.chat.completions.create({ model, messages: hello, n: 2 }), 'n');
  await expectError(OpenAI.BadRequestError, 400, "'temperature' must be in [0, 2]", () => client.chat.completions.create({ model, messages: hello, temperature: 3 }), 'temperature');
  await expectError(OpenAI.BadRequestError, 400, "'messages' must not be empty", () => client.chat.completions.create({ model, messages: [] }), 'messages');
  await expectError(OpenAI.BadRequestError, 400, "'messages' is required", () => client.chat.completions.create({ model }), 'messages');
  await expectError(OpenAI.BadRequestError, 400, "messages[0].role", () => client.chat.completions.create({ model, messages: [{ role: 'wizard', content: 'x' }] }));
  await expectError(OpenAI.BadRequestError, 400, "'max_tokens' must be in", () => client.chat.completions.create({ model, messages: hello, max_tokens: 0 }), 'max_tokens');
  await expectError(OpenAI.BadRequestError, 400, 'maximum context length', () => client.chat.completions.create({ model, messages: hello, max_tokens: 1000000 }), 'max_tokens');
  await expectError(OpenAI.BadRequestError, 400, 'unsupported JSON Schema keyword "pattern" at /properties/zip/pattern', () => client.chat.completions.create({ model, messages: hello, response_format: { type: 'json_schema', json_schema: { name: 'z', schema: { type: 'object', properties: { zip: { type: 'string', pattern: '^[0-9]+$' } } } } } }), 'response_format');
  await expectError(OpenAI.BadRequestError, 400, "not in 'tools'", () => client.chat.completions.create({ model, messages: hello, tools, tool_choice: { type: 'function', function: { name: 'nope' } } }), 'tool_choice');
  await expectError(OpenAI.BadRequestError, 400, 'no tools', () => client.chat.completions.create({ model, messages: hello, tool_choice: 'required' }), 'tool_choice');
  await expectError(OpenAI.BadRequestError, 400, 'not supported', () => client.chat.completions.create({ model, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'http://x/y.png' } }] }] }));
  await expectError(OpenAI.BadRequestError, 400, "'prompt[1]' must be a token id", () => client.completions.create({ model, prompt: [1, -5] }), 'prompt');
  await expectError(OpenAI.NotFoundError, 404, "does not exist", () => client.chat.completions.create({ model: 'gpt-4o', messages: hello }), 'model');
});

await test('raw HTTP: invalid JSON 400, 404, 405, 413, health', async () => {
  const root = BASE.replace(/\/v1$/, '');
  let r = await fetch(`${BASE}/chat/completions`, { method: 'POST', body: '{"messages": [', headers: { 'content-type': 'application/json' } });
  assert.equal(r.status, 400);
  assert.match((await r.json()).error.message, /not valid JSON/);
  r = await fetch(`${BASE}/embeddings`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 404);
  assert.equal((await r.json()).error.type, 'invalid_request_error');
  r = await fetch(`${BASE}/chat/completions`);
  assert.equal(r.status, 405);
  assert.equal(r.headers.get('allow'), 'POST');
  r = await fetch(`${BASE}/chat/completions`, { method: 'POST', body: 'x'.repeat(2 * 1024 * 1024 + 10), headers: { 'content-type': 'application/json' } });
  assert.equal(r.status, 413);
  assert.match((await r.json()).error.message, /exceeds the limit/);
  r = await fetch(`${root}/health`);
  assert.equal(r.status, 200);
  assert.equal((await r.json()).status, 'ok');
});

await test('client disconnect stops the generation', async () => {
  const ac = new AbortController();
  const s = await client.chat.completions.create({ model, messages: hello, max_tokens: 3000, temperature: 1, seed: 3, stream: true },
                                                 { signal: ac.signal });
  let n = 0;
  try {
    for await (const c of s) { if (++n === 3) ac.abort(); }
  } catch (e) { /* aborted */ }
  const root = BASE.replace(/\/v1$/, '');
  const t0 = Date.now();
  let q = 1;
  while (Date.now() - t0 < 3000) {
    q = (await (await fetch(`${root}/health`)).json()).queued;
    if (q === 0) break;
    await new Promise((res) => setTimeout(res, 50));
  }
  assert.equal(q, 0, 'the aborted request still runs');
  const r = await client.chat.completions.create({ model, messages: hello, max_tokens: 2, temperature: 0 });
  assert.ok(r.usage.completion_tokens >= 1);
});

// ---- the forced-output server: reasoning and tool calls through the model family's parser ----
const forced = new OpenAI({ baseURL: FORCED_BASE, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const expect = JSON.parse(readFileSync(FORCED_EXPECT, 'utf8'));
const weatherQ = [{ role: 'user', content: 'What is the weather in Paris and in Zürich?' }];

await test('tool calls and reasoning_content (non-stream)', async () => {
  const r = await forced.chat.completions.create({ model, messages: weatherQ, tools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content.trim(), expect.content); // the template's newlines around the markers stay
  assert.equal(m.reasoning_content.trim(), expect.reasoning_content);
  assert.equal(m.tool_calls.length, expect.tool_calls.length);
  m.tool_calls.forEach((c, i) => {
    assert.equal(c.type, 'function');
    assert.match(c.id, /^call_[0-9a-f]{24}$/);
    assert.equal(c.function.name, expect.tool_calls[i].name);
    assert.deepEqual(JSON.parse(c.function.arguments), expect.tool_calls[i].arguments);
  });
  assert.notEqual(m.tool_calls[0].id, m.tool_calls[1].id);
});

await test('tool calls and reasoning_content (stream)', async () => {
  const r = await collect(await forced.chat.completions.create({ model, messages: weatherQ, tools, stream: true,
                                                                 stream_options: { include_usage: true } }));
  assert.equal(r.finish, 'tool_calls');
  assert.equal(r.content.trim(), expect.content);
  assert.equal(r.reasoning.trim(), expect.reasoning_content);
  assert.equal(r.calls.length, expect.tool_calls.length);
  r.calls.forEach((c, i) => {
    assert.equal(c.name, expect.tool_calls[i].name);
    assert.deepEqual(JSON.parse(c.arguments), expect.tool_calls[i].arguments);
  });
  assert.ok(r.usage.completion_tokens > 20);
});

// ---- the SDK's multi-step tool loop: call -> tool results -> answer, streamed and not ----
async function toolLoop(stream) {
  const messages = [...weatherQ];
  let msg;
  if (stream) {
    const r = await collect(await forced.chat.completions.create({ model, messages, tools, stream: true }));
    assert.equal(r.finish, 'tool_calls');
    msg = { role: 'assistant', content: r.content || null,
            tool_calls: r.calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) };
  } else {
    const r = await forced.chat.completions.create({ model, messages, tools });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    msg = r.choices[0].message;
  }
  messages.push(msg);
  for (const c of msg.tool_calls) messages.push({ role: 'tool', tool_call_id: c.id, content: JSON.stringify({ city: JSON.parse(c.function.arguments).city, temp: 21 }) });
  // the answer turn, on the sampling server (the forced one would call the tools again)
  const ask = (m) => stream ? client.chat.completions.create({ model, messages: m, tools, max_tokens: 3, temperature: 0, stream: true,
                                                               stream_options: { include_usage: true } }).then(collect)
                            : client.chat.completions.create({ model, messages: m, tools, max_tokens: 3, temperature: 0 });
  const usage = (r) => (stream ? r.usage : r.usage).prompt_tokens;
  const a = await ask(messages);
  assert.equal(usage(a), promptTokens({ messages, tools }));
  // the tool-only assistant turn as OpenAI returns it: content null, or no content at all
  const asNull = messages.map((m) => (m === msg ? { ...m, content: null } : m));
  const { content: _drop, ...noContent } = msg;
  const asMissing = messages.map((m) => (m === msg ? noContent : m));
  const asEmpty = messages.map((m) => (m === msg ? { ...m, content: '' } : m));
  const want = promptTokens({ messages: asEmpty, tools });
  assert.equal(usage(await ask(asNull)), want);
  assert.equal(usage(await ask(asMissing)), want);
}
await test('SDK tool loop: call -> tool result -> answer (non-stream, content null/missing)', () => toolLoop(false));
await test('SDK tool loop: call -> tool result -> answer (stream, content null/missing)', () => toolLoop(true));

// ---- a KDA model (no rollback): the next turn of a conversation restores the previous prompt's snapshot ----
await test('prefix reuse through state snapshots (KDA model)', async () => {
  const kda = new OpenAI({ baseURL: KDA_BASE, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const turn1 = [{ role: 'user', content: 'Tell me a story about the sea.' }];
  const a = await kda.chat.completions.create({ model, messages: turn1, max_tokens: 4, temperature: 0 });
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  await kda.chat.completions.create({ model, messages: [{ role: 'user', content: 'Something else.' }], max_tokens: 2, temperature: 0 });
  const turn2 = [...turn1, { role: 'assistant', content: 'Once upon a time.' }, { role: 'user', content: 'Go on.' }];
  const c = await kda.chat.completions.create({ model, messages: turn2, max_tokens: 6, temperature: 0 });
  assert.equal(c.usage.prompt_tokens_details.cached_tokens, a.usage.prompt_tokens);
  const s = await collect(await kda.chat.completions.create({ model, messages: turn2, max_tokens: 6, temperature: 0, stream: true }));
  assert.equal(s.content, c.choices[0].message.content);
});


// ---- constrained decoding (random weights: nothing but the grammar makes the output valid) ----
const person = { type: 'object', additionalProperties: false, required: ['name', 'age', 'tags', 'ok'],
  properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer' },
                tags: { type: 'array', items: { enum: ['red', 'green', 'blue'] }, maxItems: 3 },
                ok: { type: 'boolean' }, kind: { anyOf: [{ const: 'x' }, { type: 'null' }] } } };
function checkPerson(o) {
  assert.equal(typeof o, 'object');
  for (const k of Object.keys(o)) assert.ok(['name', 'age', 'tags', 'ok', 'kind'].includes(k), `extra key ${k}`);
  assert.equal(typeof o.name, 'string');
  assert.ok([...o.name].length <= 8);
  assert.ok(Number.isInteger(o.age) || Math.abs(o.age) > 9e15, `age ${o.age}`);
  assert.ok(Array.isArray(o.tags) && o.tags.length <= 3 && o.tags.every((t) => ['red', 'green', 'blue'].includes(t)));
  assert.equal(typeof o.ok, 'boolean');
  assert.ok(!('kind' in o) || o.kind === 'x' || o.kind === null);
}
const rfPerson = { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } };

await test('chat.completions.parse with a JSON schema: 6 parsed objects validate', async () => {
  for (let i = 0; i < 6; i++) {
    const r = await client.chat.completions.parse({ model, messages: hello, max_tokens: 400, seed: 40 + i, response_format: rfPerson });
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop');
    checkPerson(m.parsed);
    assert.deepEqual(m.parsed, JSON.parse(m.content));
  }
});

await test('response_format json_schema streamed, json_object, and a length limit', async () => {
  const s = await collect(await client.chat.completions.create({ model, messages: hello, max_tokens: 400, seed: 7, stream: true, response_format: rfPerson }));
  assert.equal(s.finish, 'stop');
  checkPerson(JSON.parse(s.content));
  const o = await client.chat.completions.create({ model, messages: hello, max_tokens: 400, seed: 8, response_format: { type: 'json_object' } });
  // any JSON object: strings are unbounded, so a random-weight model may reach the limit first
  if (o.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(o.choices[0].message.content);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v));
  } else {
    assert.equal(o.choices[0].finish_reason, 'length');
    assert.ok(o.choices[0].message.content.startsWith('{'));
  }
  const cut = await client.chat.completions.create({ model, messages: hello, max_tokens: 3, seed: 9, response_format: rfPerson });
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.ok(cut.choices[0].message.content.startsWith('{'));
});

const weather = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', additionalProperties: false,
                   properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' } }, required: ['city', 'days'] } } },
                 { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { enum: ['utc', 'cet'] } }, required: ['zone'] } } }];
function checkCall(name, args) {
  const a = JSON.parse(args);
  if (name === 'get_weather') {
    assert.deepEqual(Object.keys(a).sort(), ['city', 'days']);
    assert.ok(typeof a.city === 'string' && [...a.city].length <= 12 && Number.isInteger(a.days));
  } else {
    assert.equal(name, 'get_time');
    assert.deepEqual(Object.keys(a), ['zone']);
    assert.ok(['utc', 'cet'].includes(a.zone));
  }
}

await test('tool_choice required and named: forced calls whose arguments validate, streamed and not', async () => {
  const names = new Set();
  for (let i = 0; i < 4; i++) {
    // parallel_tool_calls (default true): one call or more; false: exactly one
    const single = i >= 2;
    const r = await client.chat.completions.create({ model, messages: hello, tools: weather, tool_choice: 'required', max_tokens: 400,
      seed: 60 + i, ...(single ? { parallel_tool_calls: false } : {}) });
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue; /* several calls may reach the limit */
    assert.equal(c.finish_reason, 'tool_calls');
    assert.ok(c.message.tool_calls.length >= 1);
    if (single) assert.equal(c.message.tool_calls.length, 1);
    for (const tc of c.message.tool_calls) {
      names.add(tc.function.name);
      checkCall(tc.function.name, tc.function.arguments);
    }
  }
  for (const name of ['get_weather', 'get_time']) {
    const r = await client.chat.completions.create({ model, messages: hello, tools: weather, max_tokens: 400, seed: 70,
      tool_choice: { type: 'function', function: { name } } });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(r.choices[0].message.tool_calls[0].function.name, name);
    checkCall(name, r.choices[0].message.tool_calls[0].function.arguments);
    const s = await collect(await client.chat.completions.create({ model, messages: hello, tools: weather, max_tokens: 400, seed: 71,
      stream: true, tool_choice: { type: 'function', function: { name } } }));
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.calls.length, 1);
    assert.equal(s.calls[0].name, name);
    checkCall(name, s.calls[0].arguments);
  }
});

await test('chat.completions.parse with a forced strict function tool: parsed_arguments', async () => {
  const strictTools = [{ type: 'function', function: { ...weather[0].function, strict: true } }];
  const r = await client.chat.completions.parse({ model, messages: hello, tools: strictTools, tool_choice: 'required', max_tokens: 400, seed: 80 });
  const tc = r.choices[0].message.tool_calls[0];
  checkCall('get_weather', tc.function.arguments);
  assert.deepEqual(tc.function.parsed_arguments, JSON.parse(tc.function.arguments));
});

// logprobs / top_logprobs / logit_bias in the SDK's own shapes (values: tests/unit/test_generate.c
// checks them against the engine's logits)
function checkLogprobs(lp, n, k) {
  assert.ok(lp && Array.isArray(lp.content), 'logprobs.content');
  assert.equal(lp.refusal, null);
  assert.equal(lp.content.length, n);
  for (const e of lp.content) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
    assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
    assert.equal(e.top_logprobs.length, k);
    for (let i = 1; i < k; i++) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob);
    const mass = e.top_logprobs.reduce((a, t) => a + Math.exp(t.logprob), 0);
    assert.ok(mass <= 1 + 1e-4, `top mass ${mass}`);
    if (!e.token.startsWith('bytes:')) assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token);
  }
}

await test('chat logprobs + top_logprobs, streamed and not: an entry per token, greedy = the top token', async () => {
  const req = { model, messages: hello, max_tokens: 12, temperature: 0, logprobs: true, top_logprobs: 3 };
  const r = await client.chat.completions.create(req);
  const lp = r.choices[0].logprobs;
  // every generated token but a final EOS has an entry
  const n = r.usage.completion_tokens - (r.choices[0].finish_reason === 'stop' ? 1 : 0);
  checkLogprobs(lp, n, 3);
  for (const e of lp.content) {
    assert.equal(e.token, e.top_logprobs[0].token);
    assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-6);
  }
  const text = Buffer.concat(lp.content.map((e) => Buffer.from(e.bytes))).toString('utf8');
  if (r.choices[0].message.content) assert.ok(text.includes(r.choices[0].message.content.trim()), 'the tokens spell the content');
  // streamed: the SDK's accumulator gathers every chunk's entries; none lost or repeated (a
  // random-weight model's near-ties may pick other tokens than above: prefix reuse changes the
  // last bits of the logits)
  const s = await client.chat.completions.stream({ ...req, stream_options: { include_usage: true } }).finalChatCompletion();
  const sn = s.usage.completion_tokens - (s.choices[0].finish_reason === 'stop' ? 1 : 0);
  checkLogprobs(s.choices[0].logprobs, sn, 3);
  for (const e of s.choices[0].logprobs.content) assert.equal(e.token, e.top_logprobs[0].token);
  const stext = Buffer.concat(s.choices[0].logprobs.content.map((e) => Buffer.from(e.bytes))).toString('utf8');
  if (s.choices[0].message.content) assert.ok(stext.includes(s.choices[0].message.content.trim()), 'streamed: the tokens spell the content');
  const none = await client.chat.completions.create({ model, messages: hello, max_tokens: 2, temperature: 0 });
  assert.equal(none.choices[0].logprobs, null);
  const k0 = await client.chat.completions.create({ ...req, top_logprobs: 0, max_tokens: 3 });
  assert.ok(k0.choices[0].logprobs.content.every((e) => e.top_logprobs.length === 0));
});

await test('completions logprobs: tokens, token_logprobs, top_logprobs, text_offset; streamed the same', async () => {
  const req = { model, prompt: 'The sea is', max_tokens: 10, temperature: 0, logprobs: 2 };
  const r = await client.completions.create(req);
  const lp = r.choices[0].logprobs;
  const n = r.usage.completion_tokens - (r.choices[0].finish_reason === 'stop' ? 1 : 0);
  assert.equal(lp.tokens.length, n);
  assert.equal(lp.token_logprobs.length, n);
  assert.equal(lp.top_logprobs.length, n);
  assert.equal(lp.text_offset.length, n);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 0; i < n; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const keys = Object.keys(lp.top_logprobs[i]);
    assert.ok(keys.length >= 1 && keys.length <= 2);
    assert.ok(keys.includes(lp.tokens[i]), 'greedy: the token is among the top');
    if (i) assert.ok(lp.text_offset[i] >= lp.text_offset[i - 1]);
  }
  if (lp.tokens.every((t) => !t.startsWith('bytes:'))) assert.equal(lp.tokens.join(''), r.choices[0].text);
  const st = await client.completions.create({ ...req, stream: true });
  const toks = [], offs = [];
  for await (const c of st) {
    const l = c.choices[0]?.logprobs;
    if (l) toks.push(...l.tokens), offs.push(...l.text_offset);
  }
  assert.equal(toks.length, offs.length);
  assert.ok(toks.length >= 1 && offs[0] === 0);
  let acc = 0;
  for (let i = 0; i < toks.length && !toks[i].startsWith('bytes:'); i++) { assert.equal(offs[i], acc); acc += [...toks[i]].length; }
});

await test('logit_bias: -100 bans the greedy first token, +100 forces one; bad ids are 400s', async () => {
  const base = { model, prompt: 'The sea is', max_tokens: 1, temperature: 0 };
  const ids = JSON.parse(execFileSync(MOONSHINE, ['tokenize', MODEL_DIR], { input: 'The sea is' }).toString());
  const r0 = await client.completions.create({ ...base, logprobs: 1 });
  const first = r0.choices[0].logprobs.tokens[0];
  // the greedy token's id: tokenize the prompt + the token, the new last id
  const withTok = JSON.parse(execFileSync(MOONSHINE, ['tokenize', MODEL_DIR], { input: 'The sea is' + first }).toString());
  const id = withTok.length === ids.length + 1 ? withTok[withTok.length - 1] : null;
  if (id !== null) {
    const r1 = await client.completions.create({ ...base, logprobs: 1, logit_bias: { [id]: -100 } });
    assert.notEqual(r1.choices[0].logprobs.tokens[0], first);
  }
  const forced = ids[0];
  const r2 = await client.chat.completions.create({ model, messages: hello, max_tokens: 1, temperature: 0, logprobs: true, logit_bias: { [forced]: 100 } });
  const t2 = r2.choices[0].logprobs.content[0];
  const want = execFileSync(MOONSHINE, ['detokenize', MODEL_DIR], { input: JSON.stringify([forced]) }).toString();
  assert.equal(t2.token, want);
  await expectError(OpenAI.BadRequestError, 400, 'outside the vocabulary', () => client.chat.completions.create({ model, messages: hello, max_tokens: 1, logit_bias: { 99999999: 1 } }), 'logit_bias');
  await expectError(OpenAI.BadRequestError, 400, '[-100, 100]', () => client.chat.completions.create({ model, messages: hello, max_tokens: 1, logit_bias: { 5: 101 } }), 'logit_bias');
  await expectError(OpenAI.BadRequestError, 400, "needs 'logprobs': true", () => client.chat.completions.create({ model, messages: hello, max_tokens: 1, top_logprobs: 2 }), 'top_logprobs');
});

finish();
