// moonshine-server's Anthropic Messages and OpenAI Responses endpoints against the official SDKs
// (@anthropic-ai/sdk, openai; pinned in package-lock.json). tests/server/run.sh starts the servers.
// env: as test.mjs, plus KEY_BASE (http://127.0.0.1:PORT of the server run with --api-key KEY_VALUE).
// Prints "N passed, N failed".
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { test, finish, promptTokens as harnessPromptTokens } from './harness.mjs';

const { BASE, FORCED_BASE, FORCED_EXPECT, MODEL_NAME, MOONSHINE, MODEL_DIR, KEY_BASE, KEY_VALUE } = process.env;
const root = (b) => b.replace(/\/v1$/, '');
const model = MODEL_NAME;
const opts = { maxRetries: 0, timeout: 60000 };
const anth = new Anthropic({ baseURL: root(BASE), apiKey: 'none', ...opts });
const anthForced = new Anthropic({ baseURL: root(FORCED_BASE), apiKey: 'none', ...opts });
const oai = new OpenAI({ baseURL: BASE, apiKey: 'none', ...opts });
const oaiForced = new OpenAI({ baseURL: FORCED_BASE, apiKey: 'none', ...opts });
const expect = JSON.parse(readFileSync(FORCED_EXPECT, 'utf8'));

const promptTokens = (request) => harnessPromptTokens(MOONSHINE, MODEL_DIR, request);
const trimWs = (s) => s.replace(/^[ \t\r\n]+|[ \t\r\n]+$/g, '');

const sys = 'You are terse.';
const hello = [{ role: 'user', content: 'Say something about the sea.' }];
const chatHello = [{ role: 'system', content: sys }, ...hello];
const weatherQ = [{ role: 'user', content: 'What is the weather in Paris and in Zürich?' }];
const anthTools = [{ name: 'get_weather', description: 'Weather forecast for a city',
                     input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];
const chatTools = anthTools.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } }));
const respTools = anthTools.map((t) => ({ type: 'function', name: t.name, description: t.description, parameters: t.input_schema, strict: false }));

let greedyChat;
await test('anthropic messages.create: text block, usage = count_tokens = the chat prompt, text = chat completion', async () => {
  greedyChat = await oai.chat.completions.create({ model, messages: chatHello, max_tokens: 12, temperature: 0 });
  const m = await anth.messages.create({ model, system: sys, messages: hello, max_tokens: 12, temperature: 0 });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_[0-9a-f]{24}$/);
  const want = trimWs(greedyChat.choices[0].message.content);
  if (want) {
    assert.equal(m.content.length, 1);
    assert.equal(m.content[0].type, 'text');
    assert.equal(m.content[0].text, want);
  } else assert.equal(m.content.length, 0);
  assert.equal(m.usage.input_tokens, promptTokens({ messages: chatHello }));
  const count = await anth.messages.countTokens({ model, system: sys, messages: hello });
  assert.equal(count.input_tokens, m.usage.input_tokens);
  assert.equal(m.stop_reason, greedyChat.choices[0].finish_reason === 'length' ? 'max_tokens' : 'end_turn');
  assert.equal(m.usage.output_tokens, greedyChat.usage.completion_tokens);
});

await test('anthropic stream: exact event sequence, same text as non-stream; messages.stream().finalMessage()', async () => {
  const types = [];
  let text = '', stopReason = null, outTokens = null;
  for await (const ev of await anth.messages.create({ model, system: sys, messages: hello, max_tokens: 12, temperature: 0, stream: true })) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta') { assert.equal(ev.delta.type, 'text_delta'); text += ev.delta.text; }
    if (ev.type === 'message_delta') { stopReason = ev.delta.stop_reason; outTokens = ev.usage.output_tokens; }
  }
  // the SDK drops pings: the raw stream has message_start, ping, the blocks, message_delta, message_stop
  const raw = await (await fetch(`${root(BASE)}/v1/messages`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, system: sys, messages: hello, max_tokens: 12, temperature: 0, stream: true }) })).text();
  const names = [...raw.matchAll(/^event: (.*)$/gm)].map((x) => x[1]);
  assert.deepEqual(names.filter((n) => n !== 'ping'), types);
  assert.deepEqual(names.slice(0, 2), ['message_start', 'ping']);
  assert.equal(types[0], 'message_start');
  assert.deepEqual(types.slice(-2), ['message_delta', 'message_stop']);
  const mid = types.slice(1, -2);
  if (mid.length) {
    assert.equal(mid[0], 'content_block_start');
    assert.equal(mid[mid.length - 1], 'content_block_stop');
    assert.ok(mid.slice(1, -1).every((t) => t === 'content_block_delta'));
  }
  assert.equal(text, trimWs(greedyChat.choices[0].message.content));
  assert.equal(outTokens, greedyChat.usage.completion_tokens);
  const fin = await anth.messages.stream({ model, system: sys, messages: hello, max_tokens: 12, temperature: 0 }).finalMessage();
  assert.equal(fin.content.map((b) => b.text).join(''), text);
  assert.equal(fin.stop_reason, stopReason);
});

await test('anthropic stop_sequences: stop_reason stop_sequence, text cut before it', async () => {
  const text = trimWs(greedyChat.choices[0].message.content);
  const chars = [...text];
  assert.ok(chars.length >= 6, `greedy text too short: ${JSON.stringify(text)}`);
  const stop = chars.slice(3, 5).join('');
  const m = await anth.messages.create({ model, system: sys, messages: hello, max_tokens: 12, temperature: 0, stop_sequences: [stop, '\u0001never'] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, trimWs(text.slice(0, text.indexOf(stop))));
});

function checkToolMessage(m) {
  assert.equal(m.stop_reason, 'tool_use');
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'text', 'tool_use', 'tool_use']);
  assert.equal(m.content[0].thinking, expect.reasoning_content);
  assert.equal(m.content[1].text, expect.content);
  m.content.slice(2).forEach((b, i) => {
    assert.match(b.id, /^toolu_[0-9a-f]{24}$/);
    assert.equal(b.name, expect.tool_calls[i].name);
    assert.deepEqual(b.input, expect.tool_calls[i].arguments);
  });
}

let toolMsg;
await test('anthropic tool use + thinking blocks (non-stream)', async () => {
  toolMsg = await anthForced.messages.create({ model, messages: weatherQ, tools: anthTools, max_tokens: 500 });
  checkToolMessage(toolMsg);
  assert.ok(toolMsg.usage.output_tokens > 20);
});

await test('anthropic tool use + thinking blocks (stream: thinking_delta, input_json_delta)', async () => {
  const s = anthForced.messages.stream({ model, messages: weatherQ, tools: anthTools, max_tokens: 500 });
  const deltas = new Set();
  s.on('streamEvent', (ev) => { if (ev.type === 'content_block_delta') deltas.add(ev.delta.type); });
  const m = await s.finalMessage();
  checkToolMessage(m);
  assert.deepEqual([...deltas].sort(), ['input_json_delta', 'text_delta', 'thinking_delta']);
});

await test('anthropic tool-result turn renders as the chat messages would', async () => {
  const results = toolMsg.content.filter((b) => b.type === 'tool_use')
    .map((b) => ({ type: 'tool_result', tool_use_id: b.id, content: JSON.stringify({ city: b.input.city, temp: 21 }) }));
  const messages = [...weatherQ, { role: 'assistant', content: toolMsg.content }, { role: 'user', content: results }];
  const m = await anth.messages.create({ model, messages, tools: anthTools, max_tokens: 3, temperature: 0 });
  const calls = toolMsg.content.filter((b) => b.type === 'tool_use');
  const chat = [...weatherQ,
    { role: 'assistant', content: expect.content, reasoning_content: expect.reasoning_content,
      tool_calls: calls.map((b) => ({ id: b.id, type: 'function', function: { name: b.name, arguments: JSON.stringify(b.input) } })) },
    ...results.map((r) => ({ role: 'tool', tool_call_id: r.tool_use_id, content: r.content }))];
  assert.equal(m.usage.input_tokens, promptTokens({ messages: chat, tools: chatTools }));
  assert.ok(['max_tokens', 'end_turn', 'tool_use'].includes(m.stop_reason));
});

await test('anthropic errors: Anthropic-shaped 400s, x-api-key auth', async () => {
  const bad = async (fn, fragment, cls = Anthropic.BadRequestError) => {
    try { await fn(); } catch (e) {
      assert.ok(e instanceof cls, `expected ${cls.name}, got ${e.constructor.name}: ${e.message}`);
      assert.equal(e.error.type, 'error');
      assert.ok(e.message.includes(fragment), `${e.message} lacks ${fragment}`);
      return;
    }
    assert.fail('no error');
  };
  await bad(() => anth.messages.create({ model, messages: hello }), "'max_tokens' is required");
  await bad(() => anth.messages.create({ model, messages: hello, max_tokens: 5, tools: anthTools, tool_choice: { type: 'tool', name: 'nope' } }), "not in 'tools'");
  await bad(() => anth.messages.create({ model, messages: [{ role: 'system', content: 'x' }], max_tokens: 5 }), 'messages[0].role');
  await bad(() => anth.messages.create({ model: 'claude-x', messages: hello, max_tokens: 5 }), 'does not exist', Anthropic.NotFoundError);
  const keyed = new Anthropic({ baseURL: KEY_BASE, apiKey: KEY_VALUE, ...opts });
  const c = await keyed.messages.countTokens({ model, messages: hello });
  assert.ok(c.input_tokens > 3);
  const wrong = new Anthropic({ baseURL: KEY_BASE, apiKey: 'wrong', ...opts });
  await bad(() => wrong.messages.countTokens({ model, messages: hello }), 'Incorrect API key', Anthropic.AuthenticationError);
  const bearer = new OpenAI({ baseURL: `${KEY_BASE}/v1`, apiKey: KEY_VALUE, ...opts });
  assert.equal((await bearer.models.list()).data[0].id, model);
});

// ---- OpenAI Responses ----
await test('responses.create: string input + instructions, output_text = chat completion, usage', async () => {
  const r = await oai.responses.create({ model, instructions: sys, input: hello[0].content, max_output_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_[0-9a-f]{24}$/);
  assert.equal(r.output_text, trimWs(greedyChat.choices[0].message.content));
  assert.equal(r.usage.input_tokens, promptTokens({ messages: chatHello }));
  assert.equal(r.usage.output_tokens, greedyChat.usage.completion_tokens);
  assert.equal(r.status, greedyChat.choices[0].finish_reason === 'length' ? 'incomplete' : 'completed');
  assert.equal(r.instructions, sys);
});

function checkToolResponse(r) {
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'message', 'function_call', 'function_call']);
  assert.equal(r.output[0].content[0].text, expect.reasoning_content);
  assert.equal(r.output[1].content.map((c) => c.text).join(''), expect.content);
  if (r.output_text !== undefined) assert.equal(r.output_text, expect.content);
  r.output.slice(2).forEach((o, i) => {
    assert.match(o.call_id, /^call_[0-9a-f]{24}$/);
    assert.equal(o.name, expect.tool_calls[i].name);
    assert.deepEqual(JSON.parse(o.arguments), expect.tool_calls[i].arguments);
  });
}

let toolResp;
await test('responses.create with function tools: reasoning, message, function_call items', async () => {
  toolResp = await oaiForced.responses.create({ model, input: weatherQ, tools: respTools });
  assert.equal(toolResp.status, 'completed');
  checkToolResponse(toolResp);
  assert.deepEqual(toolResp.tools.map((t) => t.name), ['get_weather']);
});

await test('responses stream: created, output_text.delta, function_call_arguments.delta, completed', async () => {
  const types = [];
  const s = oaiForced.responses.stream({ model, input: weatherQ, tools: respTools });
  s.on('event', (ev) => types.push(ev.type));
  const r = await s.finalResponse();
  checkToolResponse(r);
  assert.equal(types[0], 'response.created');
  assert.equal(types[types.length - 1], 'response.completed');
  for (const t of ['response.output_text.delta', 'response.function_call_arguments.delta', 'response.reasoning_text.delta',
                   'response.output_item.added', 'response.output_item.done', 'response.function_call_arguments.done'])
    assert.ok(types.includes(t), `no ${t}`);
});

await test('responses: function_call_output turn via previous_response_id = the whole conversation as input', async () => {
  const outputs = toolResp.output.filter((o) => o.type === 'function_call')
    .map((o) => ({ type: 'function_call_output', call_id: o.call_id, output: JSON.stringify({ temp: 21 }) }));
  const chained = await oaiForced.responses.create({ model, previous_response_id: toolResp.id, input: outputs, tools: respTools, max_output_tokens: 2 });
  assert.equal(chained.previous_response_id, toolResp.id);
  const whole = await oaiForced.responses.create({ model, input: [...weatherQ, ...toolResp.output, ...outputs], tools: respTools, max_output_tokens: 2 });
  assert.equal(chained.usage.input_tokens, whole.usage.input_tokens);
  const chat = [...weatherQ,
    { role: 'assistant', content: expect.content, reasoning_content: expect.reasoning_content,
      tool_calls: toolResp.output.filter((o) => o.type === 'function_call').map((o) => ({ id: o.call_id, type: 'function', function: { name: o.name, arguments: o.arguments } })) },
    ...outputs.map((o) => ({ role: 'tool', tool_call_id: o.call_id, content: o.output }))];
  assert.equal(whole.usage.input_tokens, promptTokens({ messages: chat, tools: chatTools }));
  assert.ok(chained.usage.input_tokens_details.cached_tokens > 0, 'the chained prompt reuses the cached prefix');
  try {
    await oai.responses.create({ model, previous_response_id: 'resp_gone', input: 'x' });
    assert.fail('no error');
  } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.param, 'previous_response_id');
    assert.match(e.message, /not found/);
  }
});

// Responses logprobs in the SDK's shapes: ResponseOutputText.logprobs (token, bytes, logprob,
// top_logprobs of token, bytes, logprob) and the streamed ResponseTextDeltaEvent / ResponseTextDoneEvent
// logprobs (token, logprob, top_logprobs; no bytes)
function checkPartLogprobs(lp, k) {
  assert.ok(Array.isArray(lp) && lp.length > 0, 'output_text.logprobs');
  for (const e of lp) {
    assert.equal(typeof e.token, 'string');
    assert.ok(Array.isArray(e.bytes) && e.bytes.every((b) => Number.isInteger(b) && b >= 0 && b < 256));
    assert.ok(e.logprob <= 0 && Number.isFinite(e.logprob));
    assert.equal(e.top_logprobs.length, k);
    for (let i = 1; i < k; i++) assert.ok(e.top_logprobs[i].logprob <= e.top_logprobs[i - 1].logprob);
    for (const t of e.top_logprobs) assert.ok(typeof t.token === 'string' && Array.isArray(t.bytes) && t.logprob <= 0);
    assert.ok(e.top_logprobs.reduce((a, t) => a + Math.exp(t.logprob), 0) <= 1 + 1e-4);
    if (!e.token.startsWith('bytes:')) assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token);
  }
}
const spelled = (lp) => Buffer.concat(lp.map((e) => Buffer.from(e.bytes))).toString('utf8');
const eventShape = (lp) => lp.map((e) => ({ token: e.token, logprob: e.logprob,
  top_logprobs: e.top_logprobs.map((t) => ({ token: t.token, logprob: t.logprob })) }));

await test('responses logprobs (top_logprobs + include): output_text entries, greedy = the top token; streamed the same', async () => {
  const req = { model, input: hello[0].content, max_output_tokens: 12, temperature: 0, top_logprobs: 3,
                include: ['message.output_text.logprobs'] };
  const r = await oai.responses.create(req);
  assert.equal(r.top_logprobs, 3);
  const part = r.output.find((o) => o.type === 'message').content[0];
  checkPartLogprobs(part.logprobs, 3);
  for (const e of part.logprobs) assert.equal(e.token, e.top_logprobs[0].token);
  assert.ok(part.logprobs.length <= r.usage.output_tokens);
  assert.ok(spelled(part.logprobs).includes(part.text.trim()), 'the tokens spell the text');
  // streamed: every output_text.delta carries its tokens' entries; together they are the done
  // event's and the final part's (the same request: near-ties of the random model may differ, so
  // the stream is checked against itself). The final part is the one of response.incomplete (max
  // tokens): the SDK's snapshot, kept when no response.completed comes, does not gather logprobs
  const deltas = [], dones = [];
  let last = null;
  const s = oai.responses.stream(req);
  s.on('response.output_text.delta', (ev) => deltas.push(...ev.logprobs));
  s.on('response.output_text.done', (ev) => dones.push(ev));
  s.on('event', (ev) => { if (ev.type === 'response.completed' || ev.type === 'response.incomplete') last = ev.response; });
  await s.finalResponse();
  assert.ok(last, 'no response.completed / response.incomplete');
  const fpart = last.output.find((o) => o.type === 'message').content[0];
  checkPartLogprobs(fpart.logprobs, 3);
  assert.ok(deltas.every((e) => !('bytes' in e) && e.top_logprobs.every((t) => !('bytes' in t))));
  assert.deepEqual(deltas, eventShape(fpart.logprobs));
  assert.equal(dones.length, 1);
  assert.deepEqual(dones[0].logprobs, eventShape(fpart.logprobs));
  assert.ok(spelled(fpart.logprobs).includes(fpart.text.trim()), 'streamed: the tokens spell the text');
  // not asked: empty; top_logprobs 0: entries without alternatives
  const none = await oai.responses.create({ model, input: 'x', max_output_tokens: 3, temperature: 0 });
  assert.deepEqual(none.output.find((o) => o.type === 'message').content[0].logprobs, []);
  const k0 = await oai.responses.create({ ...req, top_logprobs: 0, max_output_tokens: 3 });
  const p0 = k0.output.find((o) => o.type === 'message').content[0];
  checkPartLogprobs(p0.logprobs, 0);
  const inc = await oai.responses.create({ model, input: 'x', max_output_tokens: 3, include: ['message.output_text.logprobs'] });
  checkPartLogprobs(inc.output.find((o) => o.type === 'message').content[0].logprobs, 0);
});

await test('responses logprobs with reasoning and function calls: the message part has exactly its own tokens', async () => {
  const req = { model, input: weatherQ, tools: respTools, top_logprobs: 2, include: ['message.output_text.logprobs'] };
  const r = await oaiForced.responses.create(req);
  checkToolResponse(r);
  const part = r.output[1].content[0];
  checkPartLogprobs(part.logprobs, 2);
  // no </think>, whitespace or tool-call markup: the content's tokens (the last one may end in the
  // whitespace dropped at the part's end)
  assert.equal(spelled(part.logprobs).trimEnd(), expect.content);
  assert.ok(spelled(part.logprobs).startsWith(expect.content));
  const deltas = [];
  const s = oaiForced.responses.stream(req);
  s.on('response.output_text.delta', (ev) => deltas.push(...ev.logprobs));
  const f = await s.finalResponse();
  checkToolResponse(f);
  assert.deepEqual(f.output[1].content[0].logprobs, part.logprobs);
  assert.deepEqual(deltas, eventShape(part.logprobs));
});

// a Responses request refused with a 400 whose param names the field
async function badResponses(req, param) {
  try { await oai.responses.create({ model, input: 'x', ...req }); } catch (e) {
    assert.ok(e instanceof OpenAI.BadRequestError, e.message);
    assert.equal(e.param, param);
    return;
  }
  assert.fail('no error');
}

await test('responses logprobs: refusals name the field', async () => {
  await badResponses({ top_logprobs: 21 }, 'top_logprobs');
  await badResponses({ top_logprobs: -1 }, 'top_logprobs');
  await badResponses({ include: 'message.output_text.logprobs' }, 'include');
  await badResponses({ include: [7] }, 'include');
  await badResponses({ logprobs: true }, 'logprobs');
});

await test('responses: refusals name the field (unsupported schema keyword, hosted tools)', async () => {
  await badResponses({ text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { a: { type: 'string', pattern: 'x' } } } } } }, 'text.format');
  await badResponses({ tools: [{ type: 'web_search' }] }, 'tools[0]');
  await badResponses({ reasoning: { effort: 'extreme' } }, 'reasoning.effort');
});


// ---- constrained decoding ----
const point = { type: 'object', additionalProperties: false, required: ['x', 'label'],
  properties: { x: { type: 'integer' }, label: { type: 'string', maxLength: 10 }, tag: { enum: ['a', 'b'] } } };
function checkPoint(o) {
  assert.deepEqual(Object.keys(o).filter((k) => !['x', 'label', 'tag'].includes(k)), []);
  assert.ok(Number.isInteger(o.x) || Math.abs(o.x) > 9e15);
  assert.ok(typeof o.label === 'string' && [...o.label].length <= 10);
  assert.ok(!('tag' in o) || ['a', 'b'].includes(o.tag));
}

await test('responses.parse with text.format json_schema: parsed objects validate, streamed too', async () => {
  for (let i = 0; i < 3; i++) {
    const r = await oai.responses.parse({ model, input: 'A point, please.', max_output_tokens: 300, seed: 90 + i,
      text: { format: { type: 'json_schema', name: 'point', strict: true, schema: point } } });
    assert.equal(r.status, 'completed');
    checkPoint(r.output_parsed);
    assert.equal(r.text.format.type, 'json_schema');
  }
  const st = oai.responses.stream({ model, input: 'A point.', max_output_tokens: 300,
    text: { format: { type: 'json_schema', name: 'point', strict: true, schema: point } } });
  const fin = await st.finalResponse();
  assert.equal(fin.status, 'completed', JSON.stringify(fin.output));
  const part = fin.output.find((o) => o.type === 'message').content.find((c) => c.type === 'output_text');
  checkPoint(part.parsed ?? JSON.parse(part.text));
  const jo = await oai.responses.create({ model, input: 'x', max_output_tokens: 300, text: { format: { type: 'json_object' } } });
  if (jo.status === 'completed') {
    const v = JSON.parse(jo.output_text);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v));
  } else assert.equal(jo.incomplete_details?.reason, 'max_output_tokens');
});

await test('responses tool_choice required / named: a function_call item whose arguments validate', async () => {
  const tools = [{ type: 'function', name: 'get_weather', strict: true,
    parameters: { type: 'object', additionalProperties: false, properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } },
    { type: 'function', name: 'noop', parameters: { type: 'object', properties: {} } }];
  for (const tool_choice of ['required', { type: 'function', name: 'get_weather' }]) {
    const r = await oai.responses.create({ model, input: 'Weather?', tools, tool_choice, max_output_tokens: 300, seed: 5 });
    const calls = r.output.filter((o) => o.type === 'function_call');
    // required may call several tools (parallel_tool_calls defaults to true); named: one
    if (r.status === 'incomplete') continue;
    if (typeof tool_choice === 'string') assert.ok(calls.length >= 1, JSON.stringify(r.output));
    else assert.equal(calls.length, 1, JSON.stringify(r.output));
    for (const c of calls) {
      const a = JSON.parse(c.arguments);
      if (c.name === 'noop') assert.deepEqual(a, {});
      else { assert.equal(c.name, 'get_weather'); assert.ok(typeof a.city === 'string' && [...a.city].length <= 12); }
    }
  }
});

await test('anthropic tool_choice tool / any: a tool_use block whose input validates, streamed and not', async () => {
  const tools = [{ name: 'get_weather', description: 'weather', input_schema: { type: 'object', additionalProperties: false,
    properties: { city: { type: 'string', maxLength: 12 }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } }];
  const check = (input) => {
    assert.deepEqual(Object.keys(input).sort(), ['city', 'unit']);
    assert.ok(typeof input.city === 'string' && [...input.city].length <= 12 && ['c', 'f'].includes(input.unit));
  };
  for (const tool_choice of [{ type: 'tool', name: 'get_weather' }, { type: 'any' }]) {
    const m = await anth.messages.create({ model, messages: hello, tools, tool_choice, max_tokens: 300 });
    if (m.stop_reason === 'max_tokens' && tool_choice.type === 'any') continue; /* several uses may reach the limit */
    assert.equal(m.stop_reason, 'tool_use');
    const tu = m.content.filter((b) => b.type === 'tool_use');
    // "any" may use the tool more than once (parallel tool use is on unless disabled); "tool": once
    if (tool_choice.type === 'tool') assert.equal(tu.length, 1);
    else assert.ok(tu.length >= 1);
    for (const t of tu) {
      assert.equal(t.name, 'get_weather');
      check(t.input);
    }
  }
  const stream = anth.messages.stream({ model, messages: hello, tools, tool_choice: { type: 'tool', name: 'get_weather' }, max_tokens: 300 });
  const fm = await stream.finalMessage();
  assert.equal(fm.stop_reason, 'tool_use');
  check(fm.content.find((b) => b.type === 'tool_use').input);
});

finish();
