// The dashboard of a coordinator that checks tokens, in headless Chromium.
//
//   HERDER_HTTP=http://127.0.0.1:7080 HERDER_TOKEN=... SCREENSHOT=token.png node token.mjs
//
// The page loads without a token and asks for one; the API refuses calls without it (401); once
// the user gives the token, the dashboard goes live, and the token sits in this tab's session
// storage only. "Forget token" drops it, and the page asks again. Exits non-zero on a failure.

import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const BASE = (process.env.HERDER_HTTP || '').replace(/\/+$/, '');
const TOKEN = process.env.HERDER_TOKEN || '';
const SCREENSHOT = resolve(process.env.SCREENSHOT || 'token.png');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const STEP_TIMEOUT_MS = 30_000;

if (!BASE || !TOKEN) {
  console.error('FAIL: set HERDER_HTTP and HERDER_TOKEN');
  process.exit(2);
}

function fail(message) {
  throw new Error(message);
}

async function status(path, token) {
  const headers = token ? { authorization: `Bearer ${token}` } : {};
  const response = await fetch(`${BASE}${path}`, { headers, signal: AbortSignal.timeout(10_000) });
  await response.text();
  return response.status;
}

let browser = null;
try {
  for (const [path, token, expected] of [
    ['/api/v1/jobs', null, 401],
    ['/api/v1/jobs', 'not-a-token-of-this-coordinator-0000', 401],
    ['/metrics', null, 401],
    ['/api/v1/jobs', TOKEN, 200],
    ['/metrics', TOKEN, 200],
    ['/', null, 200],
  ]) {
    const got = await status(path, token);
    if (got !== expected) fail(`${path} with ${token ? 'a token' : 'no token'}: HTTP ${got}, expected ${expected}`);
  }
  console.log('[token] ok   the API refuses calls without a valid token; the page itself loads');

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  const page = await (await browser.newContext({ viewport: { width: 1280, height: 800 } })).newPage();
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  const errors = [];
  page.on('pageerror', (err) => errors.push(err.message));

  await page.goto(`${BASE}/`, { waitUntil: 'load' });
  await page.waitForSelector('#token-form:not([hidden])');
  console.log('[token] ok   the dashboard asks for a token');

  await page.fill('#token-input', TOKEN);
  await page.click('#token-form button[type=submit]');
  await page.waitForSelector('#token-form', { state: 'hidden' });
  await page.waitForFunction(() => /live/.test(document.getElementById('live-status').textContent));
  const stored = await page.evaluate(() => [sessionStorage.getItem('herder-token'), localStorage.length]);
  if (stored[0] !== TOKEN) fail('the token is not in the session storage');
  if (stored[1] !== 0) fail('something was written to local storage, which outlives the tab');
  console.log('[token] ok   with the token the dashboard is live; the token is in session storage only');

  mkdirSync(dirname(SCREENSHOT), { recursive: true });
  await page.screenshot({ path: SCREENSHOT, fullPage: true });

  await page.click('#forget-token');
  await page.waitForSelector('#token-form:not([hidden])');
  const left = await page.evaluate(() => sessionStorage.getItem('herder-token'));
  if (left !== null) fail('"Forget token" left the token in session storage');
  console.log('[token] ok   "Forget token" drops it and the dashboard asks again');
  if (errors.length > 0) fail(`the page threw: ${errors.join('; ')}`);
} catch (err) {
  console.error(`FAIL: ${err.message}`);
  process.exitCode = 1;
} finally {
  if (browser) await browser.close();
}
