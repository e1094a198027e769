// 100 json_schema completions of 10 varied schemas on a random-weight model with the real Qwen3
// vocabulary (tests/server/run.sh's --slots server): every one must end (finish_reason "stop"),
// parse, and validate against its schema by Ajv (a validator no one here wrote). Random weights
// are the hardest case for a grammar: nothing but the mask steers the model toward valid output.
// env: BASE, MODEL_NAME; prints "N passed, N failed".
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';

const { BASE, MODEL_NAME } = process.env;
// PER_SCHEMA (default 10, i.e. 100 completions): fewer under the sanitizer builds, which are 3-5x slower
const PER_SCHEMA = Number(process.env.PER_SCHEMA || 10);
const client = new OpenAI({ baseURL: BASE, apiKey: 'none', maxRetries: 0, timeout: 300000 });
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const str = (n) => ({ type: 'string', maxLength: n });
const schemas = {
  person: { type: 'object', properties: { name: str(10), age: { type: 'integer', minimum: 0, maximum: 150 }, tags: { type: 'array', items: { enum: ['a', 'b', 'c'] }, maxItems: 3 },
    ok: { type: 'boolean' } }, required: ['name', 'age', 'tags', 'ok'], additionalProperties: false },
  tree: { $defs: { node: { type: 'object', properties: { v: { type: 'integer' }, kids: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 } },
    required: ['v'], additionalProperties: false } }, type: 'object', properties: { root: { $ref: '#/$defs/node' } }, required: ['root'], additionalProperties: false },
  union: { type: 'object', properties: { x: { anyOf: [str(6), { type: 'number' }, { type: 'null' }] }, y: { oneOf: [{ type: 'boolean' }, { type: 'integer' }] } },
    required: ['x', 'y'], additionalProperties: false },
  consts: { type: 'object', properties: { kind: { const: 'point' }, unit: { enum: ['m', 'km', 42, null, true] }, v: { type: 'number' } },
    required: ['kind', 'unit', 'v'], additionalProperties: false },
  rows: { type: 'object', properties: { rows: { type: 'array', minItems: 1, maxItems: 3, items: { type: 'object', properties: { id: { type: 'integer' }, label: str(5) },
    required: ['id', 'label'], additionalProperties: false } } }, required: ['rows'], additionalProperties: false },
  formats: { type: 'object', properties: { d: { type: 'string', format: 'date' }, t: { type: 'string', format: 'date-time' }, u: { type: 'string', format: 'uuid' },
    ip: { type: 'string', format: 'ipv4' } }, required: ['d', 't', 'u', 'ip'], additionalProperties: false },
  nullable: { type: 'object', properties: { a: { type: ['integer', 'null'] }, b: { type: 'string', maxLength: 4, nullable: true }, c: { type: ['boolean', 'string'], maxLength: 3 } },
    required: ['a', 'b', 'c'], additionalProperties: false },
  deep: { type: 'object', properties: { a: { type: 'object', properties: { b: { type: 'object', properties: { c: { type: 'array', items: { enum: [1, 2] }, maxItems: 2 } },
    required: ['c'], additionalProperties: false } }, required: ['b'], additionalProperties: false } }, required: ['a'], additionalProperties: false },
  optional: { type: 'object', properties: { p: str(4), q: { type: 'integer' }, r: { type: 'array', items: { type: 'boolean' }, maxItems: 2 } }, additionalProperties: false },
  bounded: { type: 'object', properties: { s: { type: 'string', minLength: 2, maxLength: 5 }, list: { type: 'array', items: { type: 'integer' }, minItems: 2, maxItems: 4 } },
    required: ['s', 'list'], additionalProperties: false },
};
// ajv: "nullable" is an OpenAPI keyword; the grammar reads it as adding null
const forAjv = (s) => JSON.parse(JSON.stringify(s, (k, v) => (v && typeof v === 'object' && v.nullable === true ? (({ nullable, ...rest }) => ({ anyOf: [rest, { type: 'null' }] }))(v) : v)));

let passed = 0, failed = 0;
const jobs = [];
let seed = 1000;
for (const [name, schema] of Object.entries(schemas)) for (let i = 0; i < PER_SCHEMA; i++) jobs.push({ name, schema, seed: seed++ });
const validators = Object.fromEntries(Object.entries(schemas).map(([n, s]) => [n, ajv.compile(forAjv(s))]));
const t0 = Date.now();
let next = 0, tokens = 0;
async function worker() {
  while (next < jobs.length) {
    const j = jobs[next++];
    try {
      const r = await client.chat.completions.create({ model: MODEL_NAME, max_tokens: 1000, seed: j.seed, temperature: 1,
        messages: [{ role: 'user', content: `A ${j.name}, please.` }],
        response_format: { type: 'json_schema', json_schema: { name: j.name, strict: true, schema: j.schema } } });
      tokens += r.usage.completion_tokens;
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'stop', `${j.name} seed ${j.seed}: finish ${c.finish_reason}`);
      const v = JSON.parse(c.message.content);
      const ok = validators[j.name](v);
      assert.ok(ok, `${j.name} seed ${j.seed}: ${JSON.stringify(validators[j.name].errors)} for ${c.message.content}`);
      passed++;
    } catch (e) {
      failed++;
      console.log(`FAIL ${j.name} seed ${j.seed}: ${e && e.message ? e.message : e}`);
    }
  }
}
await Promise.all([worker(), worker(), worker()]);
console.log(`${passed === jobs.length ? 'ok  ' : 'FAIL'} ${jobs.length} json_schema completions of ${Object.keys(schemas).length} schemas: ${passed} parsed and validated (${tokens} tokens, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
