// Shared helpers of the SDK e2e scripts: each check is named, run in
// order, and reported as one JSON line; the process exits 1 if any failed.
'use strict';
const assert = require('node:assert/strict');

async function run(checks) {
  let failed = 0;
  const only = process.env.SDK_ONLY ? process.env.SDK_ONLY.split(',') : null;
  for (const [name, fn] of checks) {
    if (only && !only.includes(name)) continue;
    try {
      await fn();
      console.log(JSON.stringify({ check: name, ok: true }));
    } catch (err) {
      failed++;
      console.log(JSON.stringify({ check: name, ok: false, error: String(err && err.stack || err) }));
    }
  }
  process.exit(failed ? 1 : 0);
}

// rejects asserts that p fails with an error of class cls (and status).
async function rejects(p, cls, status) {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof cls, `want ${cls.name}, got ${err && err.constructor && err.constructor.name}: ${err}`);
    if (status) assert.equal(err.status, status);
    return err;
  }
  assert.fail(`want ${cls.name}, the call succeeded`);
}

module.exports = { run, rejects, assert };
