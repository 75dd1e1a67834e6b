// One worker process of a peer job queue: SYSTEM=bullmq or graphile, CONCURRENCY jobs at once,
// the same tiny task as Herder's `sha256` (the digest of a short text). Each library's defaults
// otherwise: BullMQ keeps a completed job and its result, graphile-worker deletes the job.
import { createHash } from "node:crypto";

const digest = (text) => createHash("sha256").update(text).digest("hex");
const concurrency = Number(process.env.CONCURRENCY || 4);

if (process.env.SYSTEM === "bullmq") {
  const { Worker } = await import("bullmq");
  const connection = { host: "127.0.0.1", port: Number(process.env.REDIS_PORT) };
  const worker = new Worker("herder", async (job) => digest(job.data.text), { connection, concurrency });
  process.on("SIGTERM", () => worker.close().then(() => process.exit(0)));
} else {
  const { run } = await import("graphile-worker");
  const runner = await run({
    connectionString: process.env.DATABASE_URL,
    concurrency,
    taskList: { sha256: async (payload) => { digest(payload.text); } },
  });
  await runner.promise;
}
