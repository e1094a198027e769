// What the SDK test scripts (test.mjs, agent.mjs, frameworks.mjs, web.mjs) share: the test runner
// with its "N passed, N failed" tally, and the prompt's token count by moonshine's own CLI.
import { execFileSync } from 'node:child_process';

let passed = 0, failed = 0;

// Run one named test: passed when fn resolves, failed (with its stack) when it throws.
export async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
  }
}

// The last line tests/server/run.sh reads, and the exit status: 1 when any test failed.
export function finish() {
  console.log(`${passed} passed, ${failed} failed`);
  process.exit(failed ? 1 : 0);
}

// The prompt's token count for internal messages by moonshine's own CLI (moonshine: the binary,
// modelDir: the model): `render` (chat template, generation prompt added) then `tokenize`.
export function promptTokens(moonshine, modelDir, request) {
  const text = execFileSync(moonshine, ['render', modelDir], { input: JSON.stringify({ ...request, add_generation_prompt: true }) });
  return JSON.parse(execFileSync(moonshine, ['tokenize', modelDir], { input: text }).toString()).length;
}
