// The load generator for a peer job queue (SYSTEM=bullmq or graphile). MODE=one: CONNECTIONS
// loops with one submission in flight each; MODE=batch: CONNECTIONS loops each sending BATCH
// jobs in one bulk call (BullMQ's addBulk, graphile-worker's addJobs) and the next at once. Then,
// unless NO_WAIT is set, waits until every job has finished. Prints one JSON line: jobs per
// second from the first submission to the last job finished (or, with NO_WAIT, to the last
// acknowledgement), and the acknowledgement percentiles.
const system = process.env.SYSTEM;
const jobs = Number(process.env.JOBS);
const connections = Number(process.env.CONNECTIONS);
const batch = process.env.MODE === "batch" ? Number(process.env.BATCH) : 1;
const spec = { text: "herder" };

let submit, finished, close;
if (system === "bullmq") {
  const { Queue } = await import("bullmq");
  const connection = { host: "127.0.0.1", port: Number(process.env.REDIS_PORT) };
  const queues = Array.from({ length: connections }, () => new Queue("herder", { connection }));
  await Promise.all(queues.map((q) => q.waitUntilReady()));
  submit = (c, n) => n === 1
    ? queues[c].add("sha256", spec)
    : queues[c].addBulk(Array.from({ length: n }, () => ({ name: "sha256", data: spec })));
  finished = async () => {
    const counts = await queues[0].getJobCounts("completed", "failed");
    return counts.completed + counts.failed;
  };
  close = () => Promise.all(queues.map((q) => q.close()));
} else {
  const { makeWorkerUtils } = await import("graphile-worker");
  const pg = (await import("pg")).default;
  const utils = await Promise.all(Array.from({ length: connections },
    () => makeWorkerUtils({ connectionString: process.env.DATABASE_URL })));
  await utils[0].migrate();
  if (process.env.MODE === "migrate") process.exit(0);
  const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL, max: 1 });
  submit = (c, n) => n === 1
    ? utils[c].addJob("sha256", spec)
    : utils[c].addJobs(Array.from({ length: n }, () => ({ identifier: "sha256", payload: spec })));
  // A finished job is deleted; every job is in the table from its acknowledgement on.
  finished = async () => {
    const { rows } = await pool.query("select count(*)::int as n from graphile_worker.jobs");
    return jobs - rows[0].n;
  };
  close = async () => { await Promise.all(utils.map((u) => u.release())); await pool.end(); };
}

const acks = [];
let left = jobs;
const started = process.hrtime.bigint();
await Promise.all(Array.from({ length: connections }, async (_, c) => {
  while (left > 0) {
    const n = Math.min(batch, left);
    left -= n;
    const sent = process.hrtime.bigint();
    await submit(c, n);
    acks.push(Number(process.hrtime.bigint() - sent) / 1e6);
  }
}));
if (!process.env.NO_WAIT) {
  while ((await finished()) < jobs) await new Promise((r) => setTimeout(r, 5));
}
const seconds = Number(process.hrtime.bigint() - started) / 1e9;
acks.sort((a, b) => a - b);
const at = (q) => acks[Math.min(acks.length - 1, Math.floor(acks.length * q))];
console.log(JSON.stringify({ system, mode: process.env.MODE, waited: !process.env.NO_WAIT, jobs,
  connections, batch, jobs_per_second: jobs / seconds, ack_p50_ms: at(0.5), ack_p99_ms: at(0.99) }));
await close();
process.exit(0);
