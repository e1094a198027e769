// The built-in chat page (GET /) in headless Chromium (Debian's chromium, driven by puppeteer-core,
// pinned in package-lock.json): load it, see the model name, send a message and watch the streamed
// reply with its tokens/s, stop a second reply mid-stream (the server's queue empties), and, on the
// server with a key, the key prompt. Screenshot: $SHOT. env: BASE, KEY_BASE, KEY_VALUE, MODEL_NAME,
// CHROMIUM (default: chromium), SHOT. Prints "N passed, N failed".
import assert from 'node:assert/strict';
import puppeteer from 'puppeteer-core';
import { test, finish } from './harness.mjs';

const { BASE, FORCED_BASE, KEY_BASE, KEY_VALUE, MODEL_NAME, SHOT } = process.env;
const root = BASE.replace(/\/v1$/, '');
const queued = async () => (await (await fetch(`${root}/health`)).json()).queued;

const browser = await puppeteer.launch({ executablePath: process.env.CHROMIUM || '/usr/bin/chromium', headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'], timeout: 60000 });
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 900, height: 640 });
  const external = [];
  page.on('request', (r) => { if (!r.url().startsWith(root)) external.push(r.url()); });
  await test('the page loads, shows the model name, loads nothing external', async () => {
    const r = await page.goto(`${root}/`, { waitUntil: 'load', timeout: 30000 });
    assert.equal(r.status(), 200);
    assert.match(r.headers()['content-type'], /^text\/html/);
    assert.match(r.headers()['content-security-policy'], /connect-src 'self'/);
    await page.waitForFunction((m) => document.getElementById('model').textContent.startsWith(m), { timeout: 10000 }, MODEL_NAME);
    assert.deepEqual(external, []);
  });
  await test('send a message: the reply streams in, with tokens/s', async () => {
    await page.type('#maxtok', '24');
    await page.type('#input', 'Tell me about the sea.');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('.msg.assistant .content')[0]?.textContent.length > 0, { timeout: 30000 });
    await page.waitForFunction(() => /tokens\/s/.test(document.querySelectorAll('.msg.assistant .meta')[0]?.textContent), { timeout: 60000 });
    const meta = await page.$eval('.msg.assistant .meta', (e) => e.textContent);
    assert.match(meta, /^2[0-4] tokens · [0-9.]+ tokens\/s/);
    assert.equal(await page.$eval('.msg.user', (e) => e.textContent), 'Tell me about the sea.');
    assert.equal(await page.$eval('#send', (e) => e.textContent), 'Send');
  });
  await test('stop a reply mid-stream: the generation ends on the server', async () => {
    await page.$eval('#maxtok', (e) => { e.value = ''; });
    await page.type('#input', 'Now a very long story, please.');
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => document.querySelectorAll('.msg.assistant .content')[1]?.textContent.length > 40, { timeout: 30000 });
    assert.equal(await page.$eval('#send', (e) => e.textContent), 'Stop');
    await page.screenshot({ path: SHOT });
    await page.click('#send');
    await page.waitForFunction(() => /stopped/.test(document.querySelectorAll('.msg.assistant .meta')[1]?.textContent), { timeout: 10000 });
    const t0 = Date.now();
    while ((await queued()) !== 0 && Date.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 50));
    assert.equal(await queued(), 0, 'the stopped generation still runs');
    assert.equal(await page.$eval('#status', (e) => e.textContent), 'stopped');
  });
  await test('reasoning is shown folded (the forced-output server)', async () => {
    const p3 = await browser.newPage();
    await p3.goto(`${FORCED_BASE.replace(/\/v1$/, '')}/`, { waitUntil: 'load', timeout: 30000 });
    await p3.waitForFunction((m) => document.getElementById('model').textContent.startsWith(m), { timeout: 10000 }, MODEL_NAME);
    await p3.type('#input', 'What is the weather in Paris and in Zürich?');
    await p3.keyboard.press('Enter');
    await p3.waitForFunction(() => /tokens\/s/.test(document.querySelector('.msg.assistant .meta')?.textContent), { timeout: 60000 });
    const r = await p3.$eval('.msg.assistant', (d) => ({ shown: d.querySelector('details').style.display !== 'none',
      open: d.querySelector('details').open, reasoning: d.querySelector('details div').textContent, content: d.querySelector('.content').textContent }));
    assert.ok(r.shown && !r.open, 'reasoning is there, folded');
    assert.match(r.reasoning, /The user wants two forecasts/);
    assert.match(r.content, /Let me check both cities\./);
    await p3.close();
  });
  await test('a server with a key: the page asks for it, then works', async () => {
    const p2 = await browser.newPage();
    await p2.goto(`${KEY_BASE}/`, { waitUntil: 'load', timeout: 30000 });
    await p2.waitForFunction(() => document.getElementById('keybox').style.display === 'flex', { timeout: 10000 });
    await p2.type('#key', KEY_VALUE);
    await p2.click('#keysave');
    await p2.waitForFunction((m) => document.getElementById('model').textContent.startsWith(m), { timeout: 10000 }, MODEL_NAME);
    await p2.close();
  });
} finally {
  await browser.close();
}
finish();
