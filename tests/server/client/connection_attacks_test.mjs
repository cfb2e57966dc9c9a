// Attacks on `petrel serve`'s connections, as a hostile client would make them: compressed and
// endless bodies, slow and stalled clients, oversized heads, too many connections. Each must get
// a clean refusal while the server keeps its memory bounded and keeps answering everyone else.
//
//   node tests/server/client/connection_attacks_test.mjs build/src/petrel models/petrel-tiny
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import zlib from 'node:zlib';

import { Server, sleep } from './serve.mjs';

const [petrel, modelDir] = process.argv.slice(2);
if (!petrel || !modelDir) throw new Error('usage: node connection_attacks_test.mjs PETREL_BINARY MODEL_DIR');

const MAX_BODY = 8 << 20;
const rawPrompt = (question) => `<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n`;
const completion = JSON.stringify({ prompt: rawPrompt('What is 2 + 2?'), max_tokens: 2, temperature: 0 });

// The server's resident memory in bytes.
function rss(server) {
  const status = readFileSync(`/proc/${server.process.pid}/status`, 'utf8');
  return Number(/VmRSS:\s+(\d+) kB/.exec(status)[1]) * 1024;
}

function connect(server) {
  const { hostname, port } = new URL(server.base);
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: hostname, port: Number(port) }, () => resolve(socket));
    socket.on('error', reject);
  });
}

// Everything the server sends on `socket` until it closes it (or `ms` pass), as text.
function readAll(socket, ms = 10000) {
  return new Promise((resolve) => {
    let text = '';
    const timer = setTimeout(() => resolve(text), ms);
    socket.on('data', (d) => (text += d));
    socket.on('error', () => {});
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(text);
    });
  });
}

// Sends raw bytes on a fresh connection and returns what came back.
async function exchange(server, bytes, ms) {
  const socket = await connect(server);
  const answer = readAll(socket, ms);
  socket.write(bytes);
  return answer;
}

const statusOf = (text) => Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? -1);
const errorOf = (text) => JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4)).error;

// Default flags: what a server started as documented does against each attack.
describe('petrel serve against hostile connections', () => {
  let server;
  before(async () => {
    server = await new Server(petrel, modelDir, []).start();
  });
  after(async () => server.stop('SIGKILL'));

  test('a gzip body is refused with 415 before it is read, and memory stays bounded', async () => {
    const bomb = zlib.gzipSync(Buffer.alloc(32 << 20, 0x20));  // ~32 KB that would expand to 32 MB
    const before = rss(server);
    const answer = await exchange(server, Buffer.concat([
      Buffer.from(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
                  `Content-Encoding: gzip\r\nContent-Length: ${bomb.length}\r\n\r\n`), bomb]));
    assert.equal(statusOf(answer), 415, answer);
    assert.match(errorOf(answer).message, /Content-Encoding "gzip"/);
    assert.ok(rss(server) - before < MAX_BODY + (64 << 20), `RSS grew ${rss(server) - before} bytes`);
  });

  test('an endless chunked body is cut at the body limit with 413, and memory stays bounded', async () => {
    const before = rss(server);
    const socket = await connect(server);
    const answer = readAll(socket);
    socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n');
    const chunk = Buffer.from(`10000\r\n${' '.repeat(0x10000)}\r\n`);
    let sent = 0;
    while (!socket.destroyed && socket.writable && sent < 4 * MAX_BODY) {
      if (!socket.write(chunk)) await new Promise((resolve) => { socket.once('drain', resolve); socket.once('close', resolve); });
      sent += 0x10000;
    }
    const text = await answer;
    assert.equal(statusOf(text), 413, text.slice(0, 300));
    assert.ok(sent < 4 * MAX_BODY, 'the server read past four times its body limit');
    assert.ok(rss(server) - before < MAX_BODY + (64 << 20), `RSS grew ${rss(server) - before} bytes`);
  });

  test('too many headers, or too large a head, get 431', async () => {
    const many = Array.from({ length: 5000 }, (_, i) => `X-H${i}: v\r\n`).join('');
    const answer = await exchange(server, `GET /health HTTP/1.1\r\nHost: x\r\n${many}\r\n`);
    assert.equal(statusOf(answer), 431, answer);
    assert.match(errorOf(answer).message, /at most 100 headers/);
    const huge = await exchange(server, `GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200000)}\r\n\r\n`);
    assert.equal(statusOf(huge), 431, huge);
    // Refusals count in the metrics like answered requests.
    const metrics = await server.metrics();
    assert.equal(metrics['petrel_http_requests_total{route="/health",status="431"}'], 1, JSON.stringify(metrics));
    assert.equal(metrics['petrel_http_requests_total{route="other",status="431"}'], 1, JSON.stringify(metrics));
    // And each has its line in the request log.
    await server.logLines(/ GET \/health 431 duration_ms=[\d.]+ client=127\.0\.0\.1:\d+$/gm);
  });

  test('a form-encoded body over 8 KB is read as the JSON it holds, not refused as too large', async () => {
    const body = JSON.stringify({ prompt: rawPrompt('What is 2 + 2?'), max_tokens: 2, user: 'x'.repeat(12000) });
    const r = await fetch(`${server.base}/v1/completions`, {
      method: 'POST', headers: { 'Content-Type': 'application/x-www-form-urlencoded' }, body });
    assert.equal(r.status, 200, await r.text());
  });

  test('smuggling framings and bad request lines get 400 or 501', async () => {
    const both = await exchange(server, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n' +
                                        'Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n');
    assert.equal(statusOf(both), 400, both);
    const gzipTransfer = await exchange(server, 'POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n');
    assert.equal(statusOf(gzipTransfer), 501, gzipTransfer);
    assert.equal(statusOf(await exchange(server, 'HELLO\r\n\r\n')), 400);
  });

  test('Expect: 100-continue and pipelined requests are served', async () => {
    const socket = await connect(server);
    const answer = readAll(socket, 3000);
    socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: ${completion.length}\r\n\r\n`);
    await sleep(100);
    socket.write(completion + 'GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    const text = await answer;
    assert.match(text, /^HTTP\/1\.1 100 Continue\r\n\r\nHTTP\/1\.1 200 OK/);
    assert.match(text, /HTTP\/1\.1 200 OK[^]*"text"[^]*HTTP\/1\.1 200 OK[^]*\{"status":"ok"\}$/);
  });

  test('with 500 slow clients dribbling their heads, a normal request is answered within 1 s', async () => {
    const slow = await Promise.all(Array.from({ length: 500 }, () => connect(server)));
    const head = 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n';
    let stop = false;
    const dribble = (async () => {
      for (let i = 0; !stop && i < head.length; ++i) {
        for (const s of slow) if (!s.destroyed) s.write(head[i]);
        await sleep(50);
      }
    })();
    await sleep(300);
    const times = [];
    for (let i = 0; i < 3; ++i) {
      const started = Date.now();
      const r = await fetch(`${server.base}/v1/completions`, { method: 'POST', body: completion });
      assert.equal(r.status, 200, await r.text());
      times.push(Date.now() - started);
    }
    stop = true;
    await dribble;
    assert.ok(Math.max(...times) < 1000, `answers took ${times} ms`);
    for (const s of slow) s.destroy();
  });
});

describe('petrel serve with short deadlines', () => {
  let server;
  before(async () => {
    server = await new Server(petrel, modelDir, ['--header-timeout', '3', '--body-timeout', '3']).start();
  });
  after(async () => server.stop('SIGKILL'));

  test('a client that stalls mid-head gets 408 at the header deadline; a stalled body too', async () => {
    const started = Date.now();
    const head = await exchange(server, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
    assert.equal(statusOf(head), 408, head);
    assert.ok(Date.now() - started < 3000 + 1500, `took ${Date.now() - started} ms`);
    const body = await exchange(server, 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro');
    assert.equal(statusOf(body), 408, body);
  });
});

describe('petrel serve at its connection bound and at shutdown', () => {
  test('connections beyond --max-connections get 503 at once', async () => {
    const server = await new Server(petrel, modelDir, ['--max-connections', '8']).start();
    try {
      const held = await Promise.all(Array.from({ length: 8 }, () => connect(server)));
      await sleep(200);
      const answer = await exchange(server, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', 3000);
      assert.equal(statusOf(answer), 503, answer);
      assert.match(errorOf(answer).message, /8 connections open/);
      for (const s of held) s.destroy();
      await sleep(300);
      assert.equal((await fetch(`${server.base}/health`)).status, 200);
    } finally {
      await server.stop('SIGKILL');
    }
  });

  test('SIGTERM with stalled clients connected exits 0 within the shutdown deadline', async () => {
    const server = await new Server(petrel, modelDir, ['--shutdown-timeout', '2']).start();
    const stalled = await Promise.all(Array.from({ length: 100 }, () => connect(server)));
    for (const s of stalled) {
      s.on('error', () => {});
      s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{"pro');
    }
    await sleep(300);
    const started = Date.now();
    server.process.kill('SIGTERM');
    assert.equal(await server.exited, 0, server.log);
    assert.ok(Date.now() - started < 2000 + 2500, `exit took ${Date.now() - started} ms`);
    for (const s of stalled) s.destroy();
  });

  test('an empty --api-key is refused instead of switching authentication off', async () => {
    const child = spawn(petrel, ['serve', modelDir, '--port', '0', '--api-key', '']);
    let log = '';
    child.stderr.on('data', (d) => (log += d));
    const code = await new Promise((resolve) => child.on('exit', (c) => resolve(c)));
    assert.notEqual(code, 0, log);
    assert.match(log, /--api-key/);
    assert.doesNotMatch(log, /listening/);
  });
});
