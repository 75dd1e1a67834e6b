// End-to-end test of the Herder web dashboard in headless Chromium.
//
//   HERDER_HTTP=http://127.0.0.1:7080 SCREENSHOT=target/browser/dashboard.png node dashboard.mjs
//
// Drives the page the way a person would: waits for a live worker, submits a job through the
// form, watches it complete, opens its detail, cancels a long job from the detail panel and
// retries it as a new job. Exits non-zero with a message on the first failure.

import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { chromium } from 'playwright-core';

const BASE = (process.env.HERDER_HTTP || '').replace(/\/+$/, '');
const SCREENSHOT = resolve(process.env.SCREENSHOT || 'dashboard.png');
const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
const OVERALL_TIMEOUT_MS = Number(process.env.OVERALL_TIMEOUT_MS || 120_000);
const STEP_TIMEOUT_MS = 30_000;
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

if (!BASE) {
  console.error('FAIL: set HERDER_HTTP to the server base URL, e.g. http://127.0.0.1:7080');
  process.exit(2);
}

let browser = null;
let page = null;
const pageErrors = [];
const cleanupJobs = new Set();

class TestFailure extends Error {}

function fail(message) {
  throw new TestFailure(message);
}

function log(message) {
  console.log(`[dashboard] ${message}`);
}

/** Runs one named step; a failure names the step it happened in. */
async function step(name, fn) {
  const started = Date.now();
  try {
    const value = await fn();
    log(`ok   ${name} (${Date.now() - started} ms)`);
    return value;
  } catch (err) {
    err.step = name;
    throw err;
  }
}

async function api(method, path, body) {
  const init = { method, headers: { accept: 'application/json' }, signal: AbortSignal.timeout(10_000) };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(`${BASE}${path}`, init);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    fail(`${method} ${path}: answer is not JSON (status ${response.status}): ${text.slice(0, 200)}`);
  }
  return { status: response.status, data };
}

/** Polls the page until `predicate(arg)` is truthy; fails with `describe()` after `timeout`. */
async function waitInPage(what, predicate, arg, describe, timeout = STEP_TIMEOUT_MS) {
  try {
    await page.waitForFunction(predicate, arg, { timeout, polling: 200 });
  } catch (err) {
    let detail = '';
    if (describe) {
      try {
        detail = ` (${await describe()})`;
      } catch (_) {
        // The description is best effort.
      }
    }
    fail(`timed out after ${timeout / 1000} s waiting for ${what}${detail}`);
  }
}

function rowStateText(id) {
  return page.evaluate((jobId) => {
    const cell = document.querySelector(`tr[data-job-id="${jobId}"] td.state`);
    return cell ? cell.textContent.trim() : 'row not on the page';
  }, id);
}

async function waitForRowState(id, state) {
  await waitInPage(
    `job ${id} to show ${state} in the jobs table`,
    ([jobId, want]) => {
      const cell = document.querySelector(`tr[data-job-id="${jobId}"] td.state`);
      return cell !== null && cell.textContent.trim() === want;
    },
    [id, state],
    async () => `row shows: ${await rowStateText(id)}`,
  );
}

async function openJob(id) {
  const row = page.locator(`#jobs tr[data-job-id="${id}"]`);
  await waitInPage(`job ${id} to be listed`, (jobId) => document.querySelector(`#jobs tr[data-job-id="${jobId}"]`) !== null, id);
  await row.click();
  await waitInPage(
    `the detail panel to show job ${id}`,
    (jobId) => {
      const panel = document.querySelector(`#job-detail[data-job-id="${jobId}"]`);
      return panel !== null && panel.dataset.state !== undefined;
    },
    id,
  );
}

async function main() {
  browser = await step('launch chromium', () => chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  }));
  const context = await browser.newContext({ viewport: { width: 1440, height: 900 } });
  page = await context.newPage();
  page.setDefaultTimeout(STEP_TIMEOUT_MS);
  page.on('pageerror', (err) => pageErrors.push(err.message));

  await step('open the dashboard', async () => {
    const response = await page.goto(`${BASE}/`, { waitUntil: 'load' });
    if (!response || !response.ok()) fail(`GET / answered ${response ? response.status() : 'nothing'}`);
    const title = await page.title();
    if (!/herder/i.test(title)) fail(`unexpected page title ${JSON.stringify(title)}`);
    await page.locator('#cluster').waitFor({ state: 'visible' });
  });

  await step('cluster section lists a leader', async () => {
    await waitInPage(
      'the cluster table to list a leader',
      () => document.querySelector('#cluster tr[data-role="leader"]') !== null,
      null,
      async () => page.locator('#cluster').innerText(),
    );
  });

  await step('workers table lists an alive worker', async () => {
    await waitInPage(
      'an alive worker in #workers',
      () => document.querySelector('#workers tbody tr[data-alive="true"]') !== null,
      null,
      async () => page.locator('#workers').innerText(),
    );
  });

  const sha = await step('submit a sha256 job through the form', async () => {
    await page.locator('#submit-task').fill('{"kind":"sha256","text":"browser test"}');
    await page.locator('#submit-button').click();
    await waitInPage(
      'a job id in #submit-result',
      () => {
        const r = document.querySelector('#submit-result');
        return r !== null && (r.dataset.jobId || r.classList.contains('result-error'));
      },
      null,
    );
    const result = page.locator('#submit-result');
    const id = await result.getAttribute('data-job-id');
    if (!id) fail(`the submission failed: ${await result.innerText()}`);
    if (!UUID.test(id)) fail(`#submit-result holds ${JSON.stringify(id)}, not a job id`);
    const text = await result.innerText();
    if (!text.includes(id)) fail(`#submit-result does not show the id: ${JSON.stringify(text)}`);
    return id;
  });
  log(`     sha256 job ${sha}`);

  await step('the sha256 job completes in the jobs table', () => waitForRowState(sha, 'COMPLETED'));

  await step('its detail shows a completed attempt', async () => {
    await openJob(sha);
    await waitInPage(
      'a history row with outcome completed',
      () => [...document.querySelectorAll('#job-detail .history tbody td.outcome')]
        .some((td) => td.textContent.trim() === 'completed'),
      null,
      async () => page.locator('#detail-history').innerText(),
    );
    const task = await page.locator('#detail-task').innerText();
    if (!task.includes('browser test')) fail(`the detail's task does not show the text: ${task}`);
    const result = await page.locator('#detail-result').innerText();
    if (!result.trim()) fail('the detail shows no result for a completed job');
    if (await page.locator('#cancel-button').isVisible()) fail('cancel is offered on a COMPLETED job');
    if (await page.locator('#retry-button').isVisible()) fail('retry is offered on a COMPLETED job');
  });

  const sleeper = await step('submit a long sleep job through the API', async () => {
    const { status, data } = await api('POST', '/api/v1/jobs', { task: { kind: 'sleep', milliseconds: 600000 } });
    if (status !== 201 || !data || !UUID.test(data.job_id || '')) {
      fail(`POST /api/v1/jobs answered ${status}: ${JSON.stringify(data)}`);
    }
    cleanupJobs.add(data.job_id);
    return data.job_id;
  });
  log(`     sleep job ${sleeper}`);

  await step('cancel the sleep job from its detail panel', async () => {
    await openJob(sleeper);
    const cancel = page.locator('#cancel-button');
    await cancel.waitFor({ state: 'visible' });
    await cancel.click();
    await waitForRowState(sleeper, 'CANCELLED');
    cleanupJobs.delete(sleeper);
  });

  await step('the API reports the sleep job CANCELLED', async () => {
    const { status, data } = await api('GET', `/api/v1/jobs/${sleeper}`);
    if (status !== 200) fail(`GET /api/v1/jobs/${sleeper} answered ${status}: ${JSON.stringify(data)}`);
    if (data.state !== 'CANCELLED') fail(`the API says ${data.state}, not CANCELLED`);
  });

  await step('retry the cancelled job as a new job', async () => {
    await waitInPage(
      'the detail panel to show the job CANCELLED',
      (jobId) => {
        const panel = document.querySelector(`#job-detail[data-job-id="${jobId}"]`);
        return panel !== null && panel.dataset.state === 'CANCELLED';
      },
      sleeper,
    );
    const retry = page.locator('#retry-button');
    await retry.waitFor({ state: 'visible' });
    if (await page.locator('#cancel-button').isVisible()) fail('cancel is still offered on a CANCELLED job');
    await retry.click();
    await waitInPage(
      'the detail panel to switch to the new job',
      (oldId) => {
        const panel = document.querySelector('#job-detail[data-job-id]');
        return panel !== null && panel.dataset.jobId !== oldId && panel.dataset.state !== undefined;
      },
      sleeper,
      async () => page.locator('#action-result').innerText(),
    );
    const newId = await page.locator('#job-detail').getAttribute('data-job-id');
    if (!UUID.test(newId || '')) fail(`the detail panel holds ${JSON.stringify(newId)}, not a job id`);
    cleanupJobs.add(newId);
    const { status, data } = await api('GET', `/api/v1/jobs/${newId}`);
    if (status !== 200) fail(`GET /api/v1/jobs/${newId} answered ${status}`);
    if (JSON.stringify(data.task) !== JSON.stringify({ kind: 'sleep', milliseconds: 600000 })) {
      fail(`the retried job runs a different task: ${JSON.stringify(data.task)}`);
    }
    log(`     retry job ${newId}`);
    const cancelled = await api('POST', `/api/v1/jobs/${newId}/cancel`);
    if (cancelled.status !== 200) fail(`cancelling the retried job answered ${cancelled.status}`);
    cleanupJobs.delete(newId);
  });

  await step('the queues panel lists the default queue with its charts', async () => {
    await waitInPage(
      'a row for the default queue with a depth chart and a rate chart',
      () => {
        const row = document.querySelector('#queues tr[data-queue="default"]');
        return row !== null && row.querySelectorAll('svg.spark polyline').length === 2;
      },
      null,
    );
  });

  await step('a queue given limits through the API shows them in the panel', async () => {
    const set = await api('PATCH', '/api/v1/queues/limited', {
      concurrency: 4,
      rate: { starts: 30, per_millis: 60000 },
      key_rate: { starts: 5, per_millis: 1000 },
    });
    if (set.status !== 200) fail(`setting a queue's limits answered ${set.status}`);
    await waitInPage(
      "the limited queue's row to show its concurrency and its rates",
      () => {
        const cell = document.querySelector('#queues tr[data-queue="limited"] td.limits');
        return cell !== null && cell.textContent.includes('running ≤ 4') &&
          cell.textContent.includes('30 per') && cell.textContent.includes('per key');
      },
      null,
    );
  });

  await step('a failed job shows in the failures panel and is retried from it', async () => {
    const { status, data } = await api('POST', '/api/v1/jobs', {
      task: { kind: 'fail', fail_until_attempt: 9 },
      max_attempts: 1,
    });
    if (status !== 201 || !UUID.test((data && data.job_id) || '')) {
      fail(`POST /api/v1/jobs answered ${status}: ${JSON.stringify(data)}`);
    }
    const failedId = data.job_id;
    await waitInPage(
      'a failures row naming the failed task with a retry button',
      () => [...document.querySelectorAll('#failures tbody tr')]
        .some((row) => row.querySelector('button') !== null && row.textContent.includes('fail')),
      null,
      async () => page.locator('#failures').innerText(),
    );
    const row = page.locator('#failures tbody tr', { hasText: 'fail' }).first();
    await row.locator('button').click();
    await waitInPage(
      'the failures panel to say the jobs were retried',
      () => (document.querySelector('#failures-result')?.textContent || '').includes('Retried'),
      null,
      async () => page.locator('#failures-result').innerText(),
    );
    const listed = await api('GET', '/api/v1/jobs?limit=50');
    const retry = (listed.data.jobs || []).find((job) => job.retry_of === failedId);
    if (!retry) fail(`no job retries ${failedId}: ${JSON.stringify(listed.data.jobs.map((j) => [j.id, j.retry_of]))}`);
    log(`     failed job ${failedId} retried as ${retry.id}`);
  });

  await step('the state filter narrows the table', async () => {
    await page.locator('#state-filter').selectOption('COMPLETED');
    await waitInPage(
      'the table to list only COMPLETED jobs, including the sha256 job',
      (jobId) => {
        if (document.querySelector('#jobs.loading')) return false;
        const rows = [...document.querySelectorAll('#jobs tbody tr[data-job-id]')];
        return rows.some((tr) => tr.dataset.jobId === jobId) &&
          rows.every((tr) => tr.querySelector('td.state').textContent.trim() === 'COMPLETED');
      },
      sha,
    );
    // Jobs submitted within the same minute share the start of their ids: the table shows
    // the part that tells them apart.
    const shown = await page.$$eval('#jobs tbody tr[data-job-id]', (rows) =>
      rows.map((tr) => tr.cells[0].textContent.trim()));
    if (shown.length > 1 && new Set(shown).size !== shown.length) {
      fail(`the jobs table shows ids that look alike: ${shown.join(', ')}`);
    }
    await page.locator('#state-filter').selectOption('');
  });

  await step('save a screenshot', async () => {
    await openJob(sha);
    await waitInPage('the history to render', () => document.querySelector('#job-detail .history tbody tr') !== null, null);
    mkdirSync(dirname(SCREENSHOT), { recursive: true });
    await page.screenshot({ path: SCREENSHOT, fullPage: true });
  });

  if (pageErrors.length > 0) fail(`the page raised errors: ${pageErrors.join('; ')}`);
}

async function saveFailureScreenshot() {
  if (!page) return;
  const path = SCREENSHOT.replace(/(\.png)?$/, '-failure.png');
  try {
    mkdirSync(dirname(path), { recursive: true });
    await page.screenshot({ path, fullPage: true, timeout: 5_000 });
    console.error(`[dashboard] screenshot of the failure: ${path}`);
  } catch (_) {
    // Nothing more to save.
  }
}

async function cancelLeftovers() {
  for (const id of cleanupJobs) {
    try {
      await api('POST', `/api/v1/jobs/${id}/cancel`);
    } catch (_) {
      // Best effort: the server may be gone.
    }
  }
}

const overall = setTimeout(() => {
  console.error(`FAIL: the dashboard test did not finish within ${OVERALL_TIMEOUT_MS / 1000} s`);
  process.exit(3);
}, OVERALL_TIMEOUT_MS);

let code = 0;
try {
  await main();
  log(`PASS; screenshot saved to ${SCREENSHOT}`);
} catch (err) {
  code = 1;
  const where = err.step ? ` in step "${err.step}"` : '';
  const message = err instanceof TestFailure ? err.message : (err && err.stack) || String(err);
  console.error(`FAIL${where}: ${message}`);
  if (pageErrors.length > 0) console.error(`page errors: ${pageErrors.join('; ')}`);
  await saveFailureScreenshot();
  await cancelLeftovers();
} finally {
  if (browser) {
    await Promise.race([browser.close(), new Promise((r) => setTimeout(r, 5_000))]);
  }
  clearTimeout(overall);
}
process.exit(code);
