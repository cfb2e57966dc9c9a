#!/usr/bin/env node
// Generated tokens per second of `petrel serve` over HTTP at several concurrencies: starts the
// server on a free port, then for each concurrency C runs C requests at once, each generating
// exactly --tokens tokens (end of turn banned through logit_bias), one warm-up round and --runs
// timed rounds; prints the median (min-max) of C x tokens / wall time of a round.
//
//   scripts/serve-bench.mjs [--petrel build/src/petrel] [--model models/petrel-tiny]
//                           [--concurrency 1,8,32] [--tokens 128] [--runs 5] [-- SERVER FLAGS...]
import { spawn } from 'node:child_process';

function parseArgs(argv) {
  const options = { petrel: 'build/src/petrel', model: 'models/petrel-tiny', concurrency: '1,8,32', tokens: '128',
                    runs: '5', serverFlags: [] };
  for (let i = 0; i < argv.length; ++i) {
    if (argv[i] === '--') {
      options.serverFlags = argv.slice(i + 1);
      break;
    }
    const name = argv[i].replace(/^--/, '');
    if (!(name in options)) throw new Error(`unknown flag ${argv[i]}`);
    options[name] = argv[++i];
  }
  return { ...options, concurrency: options.concurrency.split(',').map(Number), tokens: Number(options.tokens),
           runs: Number(options.runs) };
}

async function startServer(o) {
  const maxSequences = String(Math.max(...o.concurrency));
  const child = spawn(o.petrel, ['serve', o.model, '--port', '0', '--max-sequences', maxSequences, ...o.serverFlags],
                      { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const base = await new Promise((resolve, reject) => {
    child.stderr.on('data', (d) => {
      log += d;
      const m = /listening on (http:\/\/[\d.]+:\d+)/.exec(log);
      if (m) resolve(m[1]);
    });
    child.on('exit', (code) => reject(new Error(`petrel serve exited (${code}):\n${log}`)));
  });
  while ((await fetch(`${base}/health`)).status !== 200) await new Promise((r) => setTimeout(r, 50));
  return { child, base };
}

// One request of exactly `tokens` generated tokens; resolves to that count.
async function generate(base, question, tokens) {
  const response = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: question }], max_tokens: tokens, temperature: 0,
                           logit_bias: { 2: -100 } }),
  });
  const body = await response.json();
  if (response.status !== 200) throw new Error(JSON.stringify(body));
  return body.usage.completion_tokens;
}

async function round(base, concurrency, tokens) {
  const start = performance.now();
  const counts = await Promise.all(Array.from({ length: concurrency }, (_, i) =>
    generate(base, `What is ${100 + i} + ${7 * i}?`, tokens)));
  const seconds = (performance.now() - start) / 1000;
  return counts.reduce((a, b) => a + b, 0) / seconds;
}

const o = parseArgs(process.argv.slice(2));
const { child, base } = await startServer(o);
try {
  console.log(`| concurrency | generated tokens/s, median (min-max) of ${o.runs} | tokens per request |`);
  console.log('| --- | --- | --- |');
  for (const c of o.concurrency) {
    await round(base, c, o.tokens);
    const rates = [];
    for (let r = 0; r < o.runs; ++r) rates.push(await round(base, c, o.tokens));
    rates.sort((a, b) => a - b);
    const f = (x) => x.toFixed(0);
    console.log(`| ${c} | ${f(rates[Math.floor(rates.length / 2)])} (${f(rates[0])}-${f(rates.at(-1))}) | ${o.tokens} |`);
  }
} finally {
  child.kill('SIGTERM');
}
