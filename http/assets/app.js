// Herder dashboard: polls the v1 HTTP API and renders the cluster, the workers and the jobs.
// Every value that comes from the server is inserted with textContent or as an attribute
// value, never as markup.
'use strict';

(() => {
  const API = '/api/v1';
  const POLL_MS = 1000;
  const PAGE_SIZE = 25;
  // A member the leader has not heard from for this long is reported as lagging.
  const STALE_PEER_MS = 5000;
  const TERMINAL = new Set(['COMPLETED', 'FAILED', 'CANCELLED']);
  const RETRYABLE_STATES = new Set(['FAILED', 'CANCELLED']);
  const DEFAULT_TASK = '{"kind":"sha256","text":"hello"}';

  const ui = {
    paused: false,
    polling: false,
    pending: false,
    timer: null,
    filter: '',
    cursors: [null], // cursors[i] is the `before` value of page i
    nextBefore: null,
    selectedId: null,
    detailKey: '',
    lastJobs: [],
    errors: new Map(), // source -> message of its last failure
  };

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------------------------------
  // DOM helpers

  /** Creates an element. `opts`: className, text, title, attrs, data; children: nodes or strings. */
  function el(tag, opts = {}, ...children) {
    const node = document.createElement(tag);
    if (opts.className) node.className = opts.className;
    if (opts.text !== undefined && opts.text !== null) node.textContent = String(opts.text);
    if (opts.title) node.title = String(opts.title);
    if (opts.attrs) {
      for (const [k, v] of Object.entries(opts.attrs)) {
        if (v !== undefined && v !== null && v !== false) node.setAttribute(k, String(v));
      }
    }
    if (opts.data) {
      for (const [k, v] of Object.entries(opts.data)) {
        if (v !== undefined && v !== null) node.dataset[k] = String(v);
      }
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function setText(node, value) {
    const text = value === null || value === undefined ? '' : String(value);
    if (node.textContent !== text) node.textContent = text;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  /** Replaces the children of `node` with `children`. */
  function fill(node, ...children) {
    clear(node);
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }

  const DASH = '\u2014';

  // ---------------------------------------------------------------------------------------
  // Formatting

  function pad(n, width = 2) {
    return String(n).padStart(width, '0');
  }

  function fmtDuration(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(ms)) return DASH;
    if (ms < 0) ms = 0;
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const s = ms / 1000;
    if (s < 10) return `${s.toFixed(2)} s`;
    if (s < 60) return `${s.toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h}h ${pad(m % 60)}m`;
    return `${Math.floor(h / 24)}d ${h % 24}h`;
  }

  function fmtAgo(ms) {
    if (ms === null || ms === undefined || !Number.isFinite(ms)) return DASH;
    return `${fmtDuration(ms)} ago`;
  }

  function fmtDateTime(unixMs) {
    if (!unixMs && unixMs !== 0) return DASH;
    const d = new Date(unixMs);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  /** Clock time for tables: HH:MM:SS today, with the date on other days. */
  function fmtClock(unixMs) {
    if (!unixMs && unixMs !== 0) return DASH;
    const d = new Date(unixMs);
    const now = new Date();
    const time = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    if (d.toDateString() === now.toDateString()) return time;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${time}`;
  }

  /**
   * A job id for a table cell. Job ids are time-ordered: their first characters are the
   * submission time, shared by every job of the same minute, and their last ones are random.
   * So the cell shows the end, which tells jobs apart; the full id is in the cell's title.
   */
  function shortId(id) {
    if (!id) return DASH;
    const text = String(id);
    return text.length > 12 ? `\u2026${text.slice(-8)}` : text;
  }

  /** A lease id for a table cell: numbers as they are, long ids (UUIDs) cut to 8 characters. */
  function shortLease(lease) {
    if (lease === null || lease === undefined || lease === '') return DASH;
    const text = String(lease);
    return text.length > 12 ? text.slice(0, 8) : text;
  }

  /** A value on one line, for table cells. */
  function fmtCompact(value) {
    if (value === null || value === undefined) return DASH;
    return typeof value === 'string' ? value : JSON.stringify(value);
  }

  function fmtValue(value) {
    if (value === null || value === undefined) return '';
    if (typeof value === 'string') return value;
    return JSON.stringify(value, null, 2);
  }

  function stateLabel(state) {
    return String(state || 'UNKNOWN');
  }

  function stateBadge(state) {
    const s = stateLabel(state);
    return el('span', { className: `badge state-${s.toLowerCase()}`, text: s });
  }

  function naturalCompare(a, b) {
    return String(a).localeCompare(String(b), undefined, { numeric: true, sensitivity: 'base' });
  }

  /** Run time of a job: from its first start to its end (or to now while it runs). */
  function runTime(job) {
    const start = job.first_started_at_unix_ms;
    if (!start) return null;
    const end = job.finished_at_unix_ms || (TERMINAL.has(job.state) ? null : Date.now());
    return end ? end - start : null;
  }

  /** Fills a cell with a duration that keeps counting while `live` is true. */
  function setDuration(node, ms, liveSince) {
    if (liveSince) {
      node.dataset.liveSince = String(liveSince);
    } else {
      delete node.dataset.liveSince;
    }
    setText(node, fmtDuration(ms));
  }

  function tickLiveDurations() {
    const now = Date.now();
    for (const node of document.querySelectorAll('[data-live-since]')) {
      setText(node, fmtDuration(now - Number(node.dataset.liveSince)));
    }
    for (const node of document.querySelectorAll('[data-ago-since]')) {
      setText(node, ` (${fmtAgo(now - Number(node.dataset.agoSince))})`);
    }
  }

  // ---------------------------------------------------------------------------------------
  // API access

  class ApiError extends Error {
    constructor(code, message, status, retryable) {
      super(message);
      this.code = code;
      this.status = status;
      this.retryable = retryable;
    }

    describe() {
      return `${this.code}: ${this.message}`;
    }
  }

  // A coordinator that checks tokens answers 401 without one: the token the user gives is kept
  // in this tab's session storage only (gone when the tab closes) and sent as a bearer token.
  const TOKEN_KEY = 'herder-token';
  // Where the token lives when the browser refuses session storage: this page's memory.
  let pageToken = null;

  function storedToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || pageToken;
    } catch (_) {
      return pageToken;
    }
  }

  function askForToken() {
    const form = $('token-form');
    if (form.hidden) {
      form.hidden = false;
      $('token-input').focus();
    }
    $('forget-token').hidden = storedToken() === null;
  }

  async function api(method, path, body) {
    const init = { method, headers: { accept: 'application/json' }, cache: 'no-store' };
    const token = storedToken();
    if (token) init.headers.authorization = `Bearer ${token}`;
    if (body !== undefined) {
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(API + path, init);
    } catch (err) {
      throw new ApiError('NETWORK', `the server did not answer (${err.message})`, 0, true);
    }
    const node = response.headers.get('x-herder-node');
    if (node) setText($('summary-node'), node);
    const raw = await response.text();
    let data = null;
    if (raw) {
      try {
        data = JSON.parse(raw);
      } catch (_) {
        data = null;
      }
    }
    if (response.status === 401) askForToken();
    if (!response.ok) {
      const e = data && typeof data === 'object' ? data.error : null;
      throw new ApiError(
        (e && e.code) || (e && e.kind ? String(e.kind).toUpperCase() : `HTTP_${response.status}`),
        (e && e.message) || response.statusText || 'request failed',
        response.status,
        Boolean(e && e.retryable),
      );
    }
    return data;
  }

  function describeError(err) {
    return err instanceof ApiError ? err.describe() : String(err && err.message ? err.message : err);
  }

  // ---------------------------------------------------------------------------------------
  // Cluster

  async function loadCluster() {
    const cluster = await api('GET', '/cluster');
    renderCluster(cluster || {});
  }

  function renderCluster(c) {
    const views = Array.isArray(c.members) ? c.members : [];
    const unreachable = Array.isArray(c.unreachable) ? c.unreachable : [];

    // Every member known to any answering member, with its addresses.
    const directory = new Map();
    for (const view of views) {
      for (const m of view.members || []) {
        if (!directory.has(m.node_id)) directory.set(m.node_id, m);
      }
      if (!directory.has(view.node_id)) directory.set(view.node_id, { node_id: view.node_id });
    }
    const byAddress = new Map();
    for (const m of directory.values()) {
      if (m.client_address) byAddress.set(m.client_address, m.node_id);
    }
    const answered = new Map(views.map((v) => [v.node_id, v]));
    const leaderView = views.find((v) => v.role === 'leader' && v.node_id === c.leader) ||
      views.find((v) => v.role === 'leader') || null;
    const heard = new Map();
    if (leaderView) {
      for (const m of leaderView.members || []) heard.set(m.node_id, m);
    }

    const alerts = [];
    if (!c.leader) alerts.push({ level: 'bad', text: 'No leader: the cluster cannot accept or assign jobs until one is elected.' });
    for (const u of unreachable) {
      const who = byAddress.get(u.address);
      const name = who ? `${who} (${u.address})` : u.address;
      alerts.push({ level: 'warn', text: `${name} did not answer: ${u.error || 'no reason given'}` });
    }
    for (const id of directory.keys()) {
      if (!answered.has(id) && !unreachable.some((u) => u.address === id || byAddress.get(u.address) === id)) {
        alerts.push({ level: 'warn', text: `${id} did not answer.` });
      }
    }
    for (const [id, m] of heard) {
      if (leaderView && id === leaderView.node_id) continue;
      if (typeof m.last_heard_millis_ago === 'number' && m.last_heard_millis_ago > STALE_PEER_MS) {
        alerts.push({ level: 'warn', text: `The leader last heard from ${id} ${fmtAgo(m.last_heard_millis_ago)}.` });
      }
    }

    // Members table.
    const tbody = $('members').tBodies[0];
    const ids = [...directory.keys()].sort(naturalCompare);
    const rows = ids.map((id) => {
      const view = answered.get(id);
      const dir = directory.get(id) || {};
      const peer = heard.get(id);
      const isSelf = leaderView && id === leaderView.node_id;
      let lastHeard = DASH;
      if (isSelf) lastHeard = 'leader';
      else if (peer && typeof peer.last_heard_millis_ago === 'number') lastHeard = fmtAgo(peer.last_heard_millis_ago);
      const stale = !isSelf && peer && peer.last_heard_millis_ago > STALE_PEER_MS;
      const role = view ? view.role : 'not answering';
      const roleClass = view ? `role-${String(view.role).replace(/[^a-z-]/gi, '')}` : 'role-down';
      return el('tr', { data: { nodeId: id, role }, className: view ? '' : 'row-down' },
        el('td', { className: 'mono' }, id),
        el('td', {}, el('span', { className: `badge ${roleClass}`, text: role })),
        el('td', { className: 'num mono', text: view ? view.term : DASH }),
        el('td', { className: 'num mono', text: view ? view.last_index : DASH }),
        el('td', { className: 'num mono', text: view ? view.commit_index : DASH }),
        el('td', { className: 'num mono', text: view ? view.applied_index : DASH }),
        el('td', { className: 'mono', text: dir.client_address || DASH }),
        el('td', { className: `num${stale ? ' text-warn' : ''}`, text: lastHeard }),
      );
    });
    fill(tbody, ...rows);

    const alertList = $('cluster-alerts');
    fill(alertList, ...alerts.map((a) => el('li', { className: `alert alert-${a.level}`, text: a.text })));

    // Header summary.
    const health = $('summary-health');
    let label = 'Healthy';
    let cls = 'pill-ok';
    if (!c.leader) {
      label = 'No leader';
      cls = 'pill-bad';
    } else if (alerts.length > 0) {
      label = 'Degraded';
      cls = 'pill-warn';
    }
    setText(health, label);
    health.className = `pill ${cls}`;
    setText($('summary-leader'), c.leader || 'none');
    setText($('summary-term'), c.term ?? DASH);
    const total = directory.size || views.length;
    setText($('summary-members'), answered.size === total ? String(total) : `${answered.size} of ${total} answering`);
    setText($('cluster-health-detail'), alerts.length ? `${alerts.length} issue${alerts.length === 1 ? '' : 's'}` : 'all members answering');
  }

  // ---------------------------------------------------------------------------------------
  // Workers

  async function loadWorkers() {
    const data = await api('GET', '/workers');
    renderWorkers((data && data.workers) || []);
  }

  function renderWorkers(workers) {
    const sorted = [...workers].sort((a, b) => naturalCompare(a.id, b.id));
    const tbody = $('workers').tBodies[0];
    const rows = sorted.map((w) => {
      const capacity = Number(w.capacity) || 0;
      const running = Number(w.running) || 0;
      // A prefetching worker may hold up to `prefetch` more than its slots, waiting.
      const prefetch = Number(w.prefetch) || 0;
      const pct = capacity > 0 ? Math.min(100, Math.round((running / capacity) * 100)) : 0;
      const bar = el('span', { className: 'meter', attrs: { 'aria-hidden': 'true' } }, el('span', { className: 'meter-fill' }));
      bar.firstChild.style.width = `${pct}%`;
      const tasks = Array.isArray(w.tasks) ? w.tasks : [];
      return el('tr', { data: { workerId: w.id, alive: Boolean(w.alive) }, className: w.alive ? '' : 'row-down' },
        el('td', { className: 'mono' }, w.id),
        el('td', {},
          el('span', { className: `badge ${w.alive ? 'worker-alive' : 'worker-lost'}`, text: w.alive ? 'alive' : 'lost' }),
          w.draining ? el('span', { className: 'badge worker-draining', text: 'draining' }) : null),
        el('td', { className: 'num' }, bar, el('span', { className: 'mono', text: prefetch > 0 ? `${running} / ${capacity} +${prefetch}` : `${running} / ${capacity}` })),
        el('td', { className: 'num', text: fmtAgo(w.last_heartbeat_millis_ago) }),
        el('td', { className: 'num mono', text: w.incarnation ?? DASH }),
        el('td', { className: 'chips' }, ...(tasks.length
          ? tasks.map((t) => el('span', { className: 'chip mono', text: t }))
          : [el('span', { className: 'muted', text: 'none' })])),
      );
    });
    fill(tbody, ...rows);
    $('workers-empty').hidden = sorted.length > 0;
    const alive = sorted.filter((w) => w.alive).length;
    const text = `${alive} alive of ${sorted.length}`;
    setText($('workers-count'), text);
    setText($('summary-workers'), text);
  }

  // ---------------------------------------------------------------------------------------
  // Queues: the table, and each queue's depth and finishing rate over the last two minutes,
  // sampled at every poll and kept in the page (nothing is stored on the server for it).

  const QUEUE_HISTORY_MS = 120000;
  const queueHistory = new Map();

  async function loadQueues() {
    const data = await api('GET', '/queues');
    renderQueues((data && data.queues) || []);
  }

  /** The latest failed jobs, grouped by what went wrong. */
  async function loadFailures() {
    const data = await api('GET', '/jobs?state=FAILED&limit=1000');
    renderFailures((data && data.jobs) || []);
  }

  /** An error with its ids and numbers blanked, so failures of one cause share a group. */
  function errorShape(error) {
    return String(error || '(no error recorded)')
      .replace(/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/gi, '…')
      .replace(/\d+/g, 'N')
      .slice(0, 200);
  }

  function renderFailures(jobs) {
    const groups = new Map();
    for (const job of jobs) {
      const shape = errorShape(job.error);
      const group = groups.get(shape) || { shape, ids: [], latest: 0, example: job.error || '' };
      group.ids.push(job.id);
      group.latest = Math.max(group.latest, job.finished_at_unix_ms || 0);
      groups.set(shape, group);
    }
    const sorted = [...groups.values()].sort((a, b) => b.ids.length - a.ids.length || b.latest - a.latest);
    setText($('failures-count'), jobs.length ? `${jobs.length} failed, ${sorted.length} causes` : '');
    $('failures-empty').hidden = jobs.length > 0;
    const rows = sorted.map((g) => {
      const retry = el('button', { className: 'btn btn-small', text: `Retry ${g.ids.length}`, attrs: { type: 'button' } });
      retry.addEventListener('click', () => retryAll(g, retry));
      return el('tr', { data: { shape: g.shape } },
        el('td', { className: 'mono failure-error', text: g.example, title: g.example }),
        el('td', { className: 'num mono', text: String(g.ids.length) }),
        el('td', { text: g.latest ? fmtDateTime(g.latest) : DASH }),
        el('td', {}, retry),
      );
    });
    fill($('failures').tBodies[0], ...rows);
  }

  /** Retries every job of a group as a new job (each once: a job retried before is not again). */
  async function retryAll(group, button) {
    button.disabled = true;
    let retried = 0;
    const failed = [];
    for (const id of group.ids) {
      try {
        await api('POST', `/jobs/${encodeURIComponent(id)}/retry`);
        retried += 1;
      } catch (err) {
        failed.push(`${shortId(id)}: ${describeError(err)}`);
      }
    }
    const out = $('failures-result');
    if (failed.length) showResult(out, 'error', `Retried ${retried}; not retried: ${failed.slice(0, 3).join('; ')}`);
    else showResult(out, 'ok', `Retried ${retried} jobs as new jobs.`);
    button.disabled = false;
    requestRefresh();
  }

  /** Remembers this poll's sample of each queue and forgets samples older than the window. */
  function sampleQueues(queues, now) {
    for (const q of queues) {
      const finished = (Number(q.completed) || 0) + (Number(q.failed) || 0) + (Number(q.cancelled) || 0);
      const samples = queueHistory.get(q.name) || [];
      samples.push({ at: now, depth: Number(q.queued) || 0, finished });
      while (samples.length > 0 && samples[0].at < now - QUEUE_HISTORY_MS) samples.shift();
      queueHistory.set(q.name, samples);
    }
  }

  /** Jobs finished per second between consecutive samples (retention may lower the count: never below 0). */
  function rates(samples) {
    const out = [];
    for (let i = 1; i < samples.length; i += 1) {
      const seconds = (samples[i].at - samples[i - 1].at) / 1000;
      if (seconds > 0) out.push({ at: samples[i].at, value: Math.max(0, samples[i].finished - samples[i - 1].finished) / seconds });
    }
    return out;
  }

  /** A small line chart of `points` ({at, value}) over the window ending now. */
  function sparkline(points, now, cls, label) {
    const width = 160;
    const height = 28;
    const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    svg.setAttribute('class', `spark ${cls}`);
    svg.setAttribute('role', 'img');
    const top = Math.max(1, ...points.map((p) => p.value));
    const last = points.length ? points[points.length - 1].value : 0;
    svg.setAttribute('aria-label', `${label}: ${Math.round(last * 10) / 10} now, at most ${Math.round(top * 10) / 10}`);
    const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
    const coords = points.map((p) => {
      const x = width - ((now - p.at) / QUEUE_HISTORY_MS) * width;
      const y = height - 1 - (p.value / top) * (height - 2);
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    line.setAttribute('points', coords.join(' '));
    svg.appendChild(line);
    return svg;
  }

  // A queue's limits in a few words: "running ≤ 4 · per key ≤ 1 · 30 per 1m · unfinished ≤ 100".
  function limitsText(q) {
    const parts = [];
    if (q.concurrency) parts.push(`running ≤ ${q.concurrency}`);
    if (q.key_concurrency) parts.push(`per key ≤ ${q.key_concurrency}`);
    if (q.rate) parts.push(`${q.rate.starts} per ${fmtDuration(q.rate.per_millis)}`);
    if (q.key_rate) parts.push(`${q.key_rate.starts} per ${fmtDuration(q.key_rate.per_millis)} per key`);
    if (q.max_active_jobs) parts.push(`unfinished ≤ ${q.max_active_jobs}`);
    return parts.length ? parts.join(' · ') : DASH;
  }

  function renderQueues(queues) {
    const now = Date.now();
    sampleQueues(queues, now);
    const sorted = [...queues].sort((a, b) => naturalCompare(a.name, b.name));
    const tbody = $('queues').tBodies[0];
    const rows = sorted.map((q) => {
      const samples = queueHistory.get(q.name) || [];
      const depth = samples.map((s) => ({ at: s.at, value: s.depth }));
      return el('tr', { data: { queue: q.name, paused: Boolean(q.paused) } },
        el('td', { className: 'mono', text: q.name }),
        el('td', {}, el('span', { className: `badge ${q.paused ? 'worker-draining' : 'worker-alive'}`, text: q.paused ? 'paused' : 'active' })),
        el('td', { className: 'num mono', text: String(q.weight ?? DASH) }),
        el('td', { className: 'mono limits', text: limitsText(q) }),
        el('td', { className: 'num mono queued', text: String(q.queued ?? 0) }),
        el('td', { className: 'num mono', text: String(q.running ?? 0) }),
        el('td', { className: 'num', text: q.oldest_queued_millis === undefined || q.oldest_queued_millis === null ? DASH : fmtDuration(q.oldest_queued_millis) }),
        el('td', {}, sparkline(depth, now, 'spark-depth', `${q.name} depth`)),
        el('td', {}, sparkline(rates(samples), now, 'spark-rate', `${q.name} finished per second`)),
      );
    });
    fill(tbody, ...rows);
    $('queues-empty').hidden = sorted.length > 0;
    const paused = sorted.filter((q) => q.paused).length;
    setText($('queues-count'), paused ? `${sorted.length} (${paused} paused)` : String(sorted.length));
  }

  // ---------------------------------------------------------------------------------------
  // Jobs list

  function jobsQuery() {
    const params = new URLSearchParams();
    params.set('limit', String(PAGE_SIZE));
    if (ui.filter) params.set('state', ui.filter);
    const before = ui.cursors[ui.cursors.length - 1];
    if (before) params.set('before', before);
    return params.toString();
  }

  async function loadJobs() {
    const query = jobsQuery();
    const data = await api('GET', `/jobs?${query}`);
    if (query !== jobsQuery()) return; // the filter or the page changed meanwhile
    ui.nextBefore = (data && data.next_before) || null;
    ui.lastJobs = (data && data.jobs) || [];
    renderJobs(ui.lastJobs);
    $('jobs').classList.remove('loading');
  }

  /** Dims the jobs table until the page for the new filter or cursor has arrived. */
  function markJobsLoading() {
    $('jobs').classList.add('loading');
    renderPager();
  }

  function taskKind(task) {
    if (task && typeof task === 'object' && task.kind) return String(task.kind);
    return DASH;
  }

  function jobKindCell(td, job) {
    const parts = [el('span', { className: 'mono', text: taskKind(job.task) })];
    if (job.partitions && typeof job.partitions.total === 'number') {
      parts.push(el('span', { className: 'tag', text: `${job.partitions.done ?? 0}/${job.partitions.total} pieces` }));
    }
    if (job.partition_of) {
      parts.push(el('span', { className: 'tag', text: `piece ${job.partition_of.index}`, title: `part of ${job.partition_of.parent}` }));
    }
    if (job.unserved) {
      parts.push(el('span', { className: 'tag tag-warn', text: 'unserved', title: 'No live worker serves this task kind' }));
    }
    fill(td, ...parts);
  }

  function buildJobRow(id) {
    const tr = el('tr', { data: { jobId: id }, attrs: { tabindex: '0' } },
      el('td', { className: 'id mono' }),
      el('td', { className: 'kind' }),
      el('td', { className: 'state' }),
      el('td', { className: 'attempt num mono' }),
      el('td', { className: 'worker mono' }),
      el('td', { className: 'created' }),
      el('td', { className: 'runtime num' }),
    );
    tr.addEventListener('click', () => openJob(id));
    tr.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' || ev.key === ' ') {
        ev.preventDefault();
        openJob(id);
      }
    });
    return tr;
  }

  function updateJobRow(tr, job) {
    const cells = tr.cells;
    setText(cells[0], shortId(job.id));
    cells[0].title = job.id;
    const kindKey = JSON.stringify([taskKind(job.task), job.partitions && job.partitions.done, job.partitions && job.partitions.total, job.partition_of, job.unserved]);
    if (tr.dataset.kindKey !== kindKey) {
      tr.dataset.kindKey = kindKey;
      jobKindCell(cells[1], job);
    }
    const state = stateLabel(job.state);
    if (tr.dataset.state !== state) {
      tr.dataset.state = state;
      fill(cells[2], stateBadge(state));
    }
    setText(cells[3], `${job.attempt ?? 0}/${job.max_attempts ?? '?'}`);
    setText(cells[4], job.worker || DASH);
    setText(cells[5], fmtClock(job.created_at_unix_ms));
    cells[5].title = job.created_at_unix_ms ? `${fmtDateTime(job.created_at_unix_ms)} (${fmtAgo(Date.now() - job.created_at_unix_ms)})` : '';
    const running = job.first_started_at_unix_ms && !job.finished_at_unix_ms && !TERMINAL.has(job.state);
    setDuration(cells[6], runTime(job), running ? job.first_started_at_unix_ms : null);
    tr.classList.toggle('selected', job.id === ui.selectedId);
  }

  function renderJobs(jobs) {
    const tbody = $('jobs').tBodies[0];
    const existing = new Map();
    for (const tr of tbody.rows) existing.set(tr.dataset.jobId, tr);
    const wanted = [];
    for (const job of jobs) {
      if (!job || !job.id) continue;
      const tr = existing.get(job.id) || buildJobRow(job.id);
      existing.delete(job.id);
      updateJobRow(tr, job);
      wanted.push(tr);
    }
    for (const tr of existing.values()) tr.remove();
    // Put rows in order, moving only those out of place.
    wanted.forEach((tr, i) => {
      if (tbody.rows[i] !== tr) tbody.insertBefore(tr, tbody.rows[i] || null);
    });
    $('jobs-empty').hidden = wanted.length > 0;
    renderPager();
  }

  function renderPager() {
    const page = ui.cursors.length;
    setText($('page-label'), `Page ${page}`);
    $('page-newer').disabled = page <= 1;
    $('page-newest').disabled = page <= 1;
    $('page-older').disabled = !ui.nextBefore;
  }

  function markSelectedRow() {
    for (const tr of $('jobs').tBodies[0].rows) {
      tr.classList.toggle('selected', tr.dataset.jobId === ui.selectedId);
    }
  }

  // ---------------------------------------------------------------------------------------
  // Job detail

  function openJob(id) {
    if (!id) return;
    if (ui.selectedId !== id) {
      ui.selectedId = id;
      ui.detailKey = '';
      setText($('action-result'), '');
      $('action-result').className = 'result';
    }
    const panel = $('job-detail');
    panel.dataset.jobId = id;
    panel.classList.add('open');
    $('detail-close').hidden = false;
    $('detail-placeholder').hidden = true;
    $('detail-body').hidden = false;
    setText($('detail-id'), id);
    markSelectedRow();
    try {
      history.replaceState(null, '', `#job=${encodeURIComponent(id)}`);
    } catch (_) {
      // Not fatal: the address bar just does not follow the selection.
    }
    requestRefresh();
  }

  function closeJob() {
    ui.selectedId = null;
    ui.detailKey = '';
    const panel = $('job-detail');
    delete panel.dataset.jobId;
    delete panel.dataset.state;
    panel.classList.remove('open');
    $('detail-close').hidden = true;
    $('detail-placeholder').hidden = false;
    setText($('detail-placeholder'), 'Select a job to see its full view.');
    $('detail-body').hidden = true;
    markSelectedRow();
    try {
      history.replaceState(null, '', location.pathname + location.search);
    } catch (_) {
      // Ignored, as above.
    }
  }

  async function loadDetail() {
    const id = ui.selectedId;
    if (!id) return;
    let job;
    try {
      job = await api('GET', `/jobs/${encodeURIComponent(id)}`);
    } catch (err) {
      if (ui.selectedId !== id) return;
      if (err instanceof ApiError && (err.code === 'JOB_NOT_FOUND' || err.code === 'INVALID_REQUEST')) {
        renderDetailMissing(id, err);
        return;
      }
      throw err;
    }
    if (ui.selectedId !== id) return;
    renderDetail(job);
  }

  function renderDetailMissing(id, err) {
    ui.detailKey = '';
    $('detail-body').hidden = true;
    $('detail-placeholder').hidden = false;
    setText($('detail-placeholder'), `Job ${id} is not available: ${describeError(err)}`);
  }

  function field(label, ...value) {
    return [el('dt', { text: label }), el('dd', {}, ...value)];
  }

  function timeField(label, unixMs) {
    if (!unixMs) return field(label, el('span', { className: 'muted', text: DASH }));
    return field(label, el('span', { text: fmtDateTime(unixMs) }),
      el('span', { className: 'muted', text: ` (${fmtAgo(Date.now() - unixMs)})`, data: { agoSince: unixMs } }));
  }

  function jobLink(id, text) {
    const b = el('button', { className: 'link mono', text: text || id, title: id, attrs: { type: 'button' }, data: { openJob: id } });
    b.addEventListener('click', (ev) => {
      ev.stopPropagation();
      openJob(id);
    });
    return b;
  }

  function renderDetail(job) {
    $('detail-body').hidden = false;
    $('detail-placeholder').hidden = true;
    const panel = $('job-detail');
    const state = stateLabel(job.state);
    panel.dataset.jobId = job.id;
    panel.dataset.state = state;

    const cancelBtn = $('cancel-button');
    const retryBtn = $('retry-button');
    // A partition is cancelled through its parent job.
    cancelBtn.hidden = TERMINAL.has(state) || Boolean(job.partition_of);
    retryBtn.hidden = !(RETRYABLE_STATES.has(state) && !job.partition_of);

    const key = JSON.stringify(job);
    if (key === ui.detailKey) return;
    ui.detailKey = key;

    setText($('detail-id'), job.id);
    const badges = [stateBadge(state), el('span', { className: 'tag mono', text: taskKind(job.task) })];
    if (job.unserved) badges.push(el('span', { className: 'tag tag-warn', text: 'no live worker serves this task' }));
    fill($('detail-badges'), ...badges);

    const running = job.first_started_at_unix_ms && !job.finished_at_unix_ms && !TERMINAL.has(state);
    const runCell = el('span');
    setDuration(runCell, runTime(job), running ? job.first_started_at_unix_ms : null);
    const fields = [
      ...field('State', state),
      ...field('Attempt', el('span', { className: 'mono', text: `${job.attempt ?? 0} of ${job.max_attempts ?? '?'}` })),
      ...field('Worker', el('span', { className: 'mono', text: job.worker || DASH })),
      ...field('Lease', el('span', { className: 'mono', text: job.lease_id ?? DASH })),
      ...timeField('Created', job.created_at_unix_ms),
      ...timeField('First started', job.first_started_at_unix_ms),
      ...timeField('Finished', job.finished_at_unix_ms),
      ...field('Run time', runCell),
      ...field('Timeout', job.timeout_millis ? fmtDuration(job.timeout_millis) : el('span', { className: 'muted', text: 'none' })),
    ];
    if (job.retry_of) fields.push(...field('Retry of', jobLink(job.retry_of, shortId(job.retry_of))));
    if (job.after && job.after.length) {
      const links = [];
      job.after.forEach((id, i) => {
        if (i > 0) links.push(el('span', { text: ', ' }));
        links.push(jobLink(id, shortId(id)));
      });
      links.push(el('span', { className: 'muted', text: job.after_any_outcome ? ' (whatever they end as)' : ' (once they completed)' }));
      fields.push(...field('Waits for', ...links));
    }
    if (job.waited_on_by && job.waited_on_by.length) {
      const links = [];
      job.waited_on_by.forEach((id, i) => {
        if (i > 0) links.push(el('span', { text: ', ' }));
        links.push(jobLink(id, shortId(id)));
      });
      fields.push(...field('Awaited by', ...links));
    }
    if (job.run_at_unix_ms) {
      const ahead = job.run_at_unix_ms - Date.now();
      fields.push(...field('Runs at', el('span', { text: fmtDateTime(job.run_at_unix_ms) }),
        el('span', { className: 'muted', text: ahead > 0 ? ` (in ${fmtDuration(ahead)})` : '' })));
    }
    if (job.idempotency_key) fields.push(...field('Idempotency key', el('span', { className: 'mono', text: job.idempotency_key })));
    if (job.progress) fields.push(...field('Progress', job.progress));
    if (job.partition_of) {
      fields.push(...field('Part of', jobLink(job.partition_of.parent, shortId(job.partition_of.parent)),
        el('span', { className: 'muted', text: ` (piece ${job.partition_of.index})` })));
    }
    fill($('detail-fields'), ...fields);

    setText($('detail-task'), fmtValue(job.task));
    const hasResult = job.result !== null && job.result !== undefined;
    $('detail-result-section').hidden = !hasResult;
    setText($('detail-result'), hasResult ? fmtValue(job.result) : '');
    const hasError = job.error !== null && job.error !== undefined && job.error !== '';
    $('detail-error-section').hidden = !hasError;
    setText($('detail-error'), hasError ? fmtValue(job.error) : '');

    renderPartitions(job.partitions);
    renderHistory(job);
  }

  function renderPartitions(parts) {
    const section = $('detail-partitions');
    if (!parts || typeof parts.total !== 'number') {
      section.hidden = true;
      return;
    }
    section.hidden = false;
    const total = parts.total;
    const done = parts.done ?? 0;
    const pct = total > 0 ? Math.round((done / total) * 100) : 0;
    $('partition-bar').style.width = `${pct}%`;
    const bar = section.querySelector('.progress');
    bar.setAttribute('aria-valuemax', String(total));
    bar.setAttribute('aria-valuenow', String(done));
    setText($('partition-label'), `${done} of ${total} pieces done (${pct}%)`);
    const pieces = Array.isArray(parts.pieces) ? [...parts.pieces].sort((a, b) => a.index - b.index) : [];
    const rows = pieces.map((p) => {
      const tr = el('tr', { data: { jobId: p.job_id, index: p.index }, attrs: { tabindex: '0' } },
        el('td', { className: 'num mono', text: p.index }),
        el('td', { className: 'mono', text: shortId(p.job_id), title: p.job_id }),
        el('td', { className: 'state' }, stateBadge(p.state)),
        el('td', { className: 'num mono', text: p.attempt ?? DASH }),
        el('td', { className: 'mono', text: p.worker || DASH }),
        el('td', { className: 'mono ellipsis', text: fmtCompact(p.result), title: fmtCompact(p.result) }),
      );
      tr.addEventListener('click', () => openJob(p.job_id));
      tr.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter') openJob(p.job_id);
      });
      return tr;
    });
    fill($('partition-pieces').tBodies[0], ...rows);
  }

  function renderHistory(job) {
    const history = Array.isArray(job.history) ? job.history : [];
    const rows = history.flatMap((h) => {
      const ongoing = !h.ended_at_unix_ms;
      const duration = el('td', { className: 'num' });
      if (h.started_at_unix_ms) {
        const end = h.ended_at_unix_ms || (TERMINAL.has(job.state) ? null : Date.now());
        setDuration(duration, end ? end - h.started_at_unix_ms : null, ongoing && !TERMINAL.has(job.state) ? h.started_at_unix_ms : null);
      } else {
        setText(duration, DASH);
      }
      const outcome = h.outcome || (ongoing && !TERMINAL.has(job.state) ? 'running' : '');
      const row = el('tr', { data: { attempt: h.attempt, outcome }, className: h.error ? 'has-error' : '' },
        el('td', { className: 'num mono', text: h.attempt ?? DASH }),
        el('td', { className: 'mono', text: h.worker || DASH }),
        el('td', { className: 'mono', text: shortLease(h.lease_id), title: h.lease_id ?? '' }),
        el('td', { text: fmtClock(h.started_at_unix_ms), title: h.started_at_unix_ms ? fmtDateTime(h.started_at_unix_ms) : '' }),
        el('td', { text: fmtClock(h.ended_at_unix_ms), title: h.ended_at_unix_ms ? fmtDateTime(h.ended_at_unix_ms) : '' }),
        duration,
        el('td', { className: 'outcome' }, el('span', { className: `badge outcome-${outcome.replace(/[^a-z_]/gi, '') || 'none'}`, text: outcome || DASH })),
      );
      if (!h.error) return [row];
      // The error gets a full-width row of its own under its attempt, so long ones stay readable.
      const errorRow = el('tr', { className: 'history-error', data: { attempt: h.attempt } },
        el('td', { attrs: { colspan: '7' } },
          el('span', { className: 'error-label', text: `Attempt ${h.attempt ?? '?'} error: ` }),
          el('span', { className: 'error-text', text: h.error })));
      return [row, errorRow];
    });
    fill($('detail-history').tBodies[0], ...rows);
    $('history-empty').hidden = history.length > 0;
    const dropped = Number(job.history_dropped) || 0;
    $('history-dropped').hidden = dropped === 0;
    setText($('history-dropped'), dropped ? `${dropped} earlier attempt${dropped === 1 ? ' is' : 's are'} not shown (history is capped).` : '');
  }

  // ---------------------------------------------------------------------------------------
  // Actions

  function showResult(node, kind, ...content) {
    node.className = `result result-${kind}`;
    fill(node, ...content);
  }

  function parseSubmission() {
    const raw = $('submit-task').value.trim();
    if (!raw) throw new Error('Enter a task as JSON, for example {"kind":"sha256","text":"hello"}.');
    let parsed;
    try {
      parsed = JSON.parse(raw);
    } catch (err) {
      throw new Error(`The task is not valid JSON: ${err.message}`);
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
      throw new Error('The task must be a JSON object with a "kind" field.');
    }
    // A whole request body ({"task": {...}, ...}) is accepted as well as a bare task.
    const body = ('task' in parsed && !('kind' in parsed)) ? { ...parsed } : { task: parsed };
    const attempts = $('submit-max-attempts').value.trim();
    if (attempts) {
      const n = Number(attempts);
      if (!Number.isInteger(n) || n < 1) throw new Error('Max attempts must be a whole number of at least 1.');
      body.max_attempts = n;
    }
    const partitions = $('submit-partitions').value.trim();
    if (partitions) {
      if (partitions.toLowerCase() === 'auto') {
        body.partitions = 'auto';
      } else {
        const n = Number(partitions);
        if (!Number.isInteger(n) || n < 1) throw new Error('Partitions must be a whole number of at least 1, or auto.');
        body.partitions = n;
      }
    }
    return body;
  }

  async function onSubmit(ev) {
    ev.preventDefault();
    const result = $('submit-result');
    const button = $('submit-button');
    delete result.dataset.jobId;
    let body;
    try {
      body = parseSubmission();
    } catch (err) {
      showResult(result, 'error', err.message);
      return;
    }
    button.disabled = true;
    showResult(result, 'pending', 'Submitting\u2026');
    try {
      const answer = await api('POST', '/jobs', body);
      const id = answer && answer.job_id;
      if (!id) throw new Error('the server answered without a job id');
      result.dataset.jobId = id;
      showResult(result, 'ok',
        answer.existing ? 'Existing job (idempotency key matched): ' : 'Submitted job ',
        jobLink(id));
      requestRefresh();
    } catch (err) {
      delete result.dataset.jobId;
      showResult(result, 'error', describeError(err));
    } finally {
      button.disabled = false;
    }
  }

  async function onCancel() {
    const id = ui.selectedId;
    if (!id) return;
    const button = $('cancel-button');
    const out = $('action-result');
    button.disabled = true;
    showResult(out, 'pending', 'Cancelling\u2026');
    try {
      const answer = await api('POST', `/jobs/${encodeURIComponent(id)}/cancel`);
      if (ui.selectedId !== id) return;
      if (answer && answer.cancelled) {
        showResult(out, 'ok', 'The job is cancelled.');
      } else {
        const state = answer && answer.job ? stateLabel(answer.job.state) : 'unknown';
        showResult(out, 'warn', `The job was not cancelled; it is ${state}.`);
      }
      if (answer && answer.job) renderDetail(answer.job);
      requestRefresh();
    } catch (err) {
      if (ui.selectedId === id) showResult(out, 'error', describeError(err));
    } finally {
      button.disabled = false;
    }
  }

  async function onRetry() {
    const id = ui.selectedId;
    if (!id) return;
    const button = $('retry-button');
    const out = $('action-result');
    button.disabled = true;
    showResult(out, 'pending', 'Submitting a new job\u2026');
    try {
      const answer = await api('POST', `/jobs/${encodeURIComponent(id)}/retry`);
      const newId = answer && answer.job_id;
      if (!newId) throw new Error('the server answered without a job id');
      openJob(newId);
      showResult($('action-result'), 'ok', 'Submitted as a new job; retry of ', jobLink(id, shortId(id)), '.');
    } catch (err) {
      if (ui.selectedId === id) showResult(out, 'error', describeError(err));
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------------------------------
  // Polling

  function setLive(status, cls) {
    setText($('live-status'), status);
    $('live-indicator').className = `live-dot ${cls}`;
  }

  async function refresh() {
    const sources = [['cluster', loadCluster], ['workers', loadWorkers], ['queues', loadQueues], ['failures', loadFailures], ['jobs', loadJobs], ['detail', loadDetail]];
    const results = await Promise.allSettled(sources.map(([, load]) => load()));
    results.forEach((r, i) => {
      const name = sources[i][0];
      if (r.status === 'rejected') ui.errors.set(name, describeError(r.reason));
      else ui.errors.delete(name);
    });
    tickLiveDurations();
    const banner = $('connection-banner');
    if (ui.errors.size > 0) {
      const [name, message] = ui.errors.entries().next().value;
      banner.hidden = false;
      setText(banner, `Could not load ${name}: ${message}. Retrying every second.`);
      setLive(ui.paused ? 'paused' : 'error', 'live-error');
    } else {
      banner.hidden = true;
      const now = new Date();
      const at = `${pad(now.getHours())}:${pad(now.getMinutes())}:${pad(now.getSeconds())}`;
      setLive(ui.paused ? `paused, updated ${at}` : `live, updated ${at}`, ui.paused ? 'live-paused' : 'live-ok');
    }
  }

  function schedule() {
    clearTimeout(ui.timer);
    ui.timer = null;
    if (!ui.paused) ui.timer = setTimeout(tick, POLL_MS);
  }

  async function tick() {
    if (ui.polling) {
      ui.pending = true;
      return;
    }
    ui.polling = true;
    clearTimeout(ui.timer);
    try {
      await refresh();
    } catch (err) {
      setLive(`error: ${describeError(err)}`, 'live-error');
    } finally {
      ui.polling = false;
      if (ui.pending) {
        ui.pending = false;
        tick();
      } else {
        schedule();
      }
    }
  }

  /** Refreshes now (once, even when paused), instead of at the next poll. */
  function requestRefresh() {
    tick();
  }

  function setPaused(paused) {
    ui.paused = paused;
    const button = $('pause-button');
    setText(button, paused ? 'Resume' : 'Pause');
    button.setAttribute('aria-pressed', paused ? 'true' : 'false');
    if (paused) {
      clearTimeout(ui.timer);
      ui.timer = null;
      setLive('paused', 'live-paused');
    } else {
      requestRefresh();
    }
  }

  // ---------------------------------------------------------------------------------------
  // Wiring

  function init() {
    const task = $('submit-task');
    if (!task.value.trim()) task.value = DEFAULT_TASK;
    $('submit-form').addEventListener('submit', onSubmit);
    $('submit-example').addEventListener('change', (ev) => {
      if (!ev.target.value) return;
      task.value = ev.target.value;
      ev.target.value = '';
      task.focus();
    });
    $('cancel-button').addEventListener('click', onCancel);
    $('retry-button').addEventListener('click', onRetry);
    $('detail-close').addEventListener('click', closeJob);
    $('pause-button').addEventListener('click', () => setPaused(!ui.paused));
    $('state-filter').addEventListener('change', (ev) => {
      ui.filter = ev.target.value;
      ui.cursors = [null];
      ui.nextBefore = null;
      markJobsLoading();
      requestRefresh();
    });
    $('page-older').addEventListener('click', () => {
      if (!ui.nextBefore) return;
      ui.cursors.push(ui.nextBefore);
      ui.nextBefore = null;
      markJobsLoading();
      requestRefresh();
    });
    $('page-newer').addEventListener('click', () => {
      if (ui.cursors.length <= 1) return;
      ui.cursors.pop();
      markJobsLoading();
      requestRefresh();
    });
    $('page-newest').addEventListener('click', () => {
      ui.cursors = [null];
      markJobsLoading();
      requestRefresh();
    });
    document.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && ui.selectedId && !(ev.target instanceof HTMLTextAreaElement)) closeJob();
    });
    renderPager();
    $('token-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const value = $('token-input').value.trim();
      if (!value) return;
      pageToken = value;
      try {
        sessionStorage.setItem(TOKEN_KEY, value);
      } catch (_) {
        // Storage refused: the token lasts until the page reloads.
      }
      $('token-input').value = '';
      $('token-form').hidden = true;
      $('forget-token').hidden = false;
      requestRefresh();
    });
    $('forget-token').addEventListener('click', () => {
      pageToken = null;
      try {
        sessionStorage.removeItem(TOKEN_KEY);
      } catch (_) {
        // Nothing stored.
      }
      $('forget-token').hidden = true;
      requestRefresh();
    });
    $('forget-token').hidden = storedToken() === null;

    const match = /^#job=([^&]+)$/.exec(location.hash);
    if (match) {
      openJob(decodeURIComponent(match[1]));
    } else {
      requestRefresh();
    }
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', init);
  } else {
    init();
  }
})();
