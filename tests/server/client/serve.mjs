// `petrel serve` as a child process for the HTTP tests of this folder: start on a free port,
// wait until ready, post, read /metrics, stop with a signal.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';

export const API_KEY = 'test-key';

// `petrel serve` on a free port; resolves once /health says the model is ready.
export class Server {
  constructor(petrel, modelDir, args) {
    this.petrel = petrel;
    this.modelDir = modelDir;
    this.args = args;
    this.log = '';
  }

  async start() {
    // One CPU thread: the tests run beside other work on small CI machines.
    this.process = spawn(this.petrel, ['serve', '-m', this.modelDir, '--port', '0', '-t', '1', ...this.args]);
    this.exited = new Promise((resolve) => this.process.on('exit', (code, signal) => resolve(code ?? signal)));
    this.base = await new Promise((resolve, reject) => {
      this.process.stderr.on('data', (data) => {
        this.log += data;
        const match = /listening on (http:\/\/[\d.]+:\d+)/.exec(this.log);
        if (match) resolve(match[1]);
      });
      this.exited.then((code) => reject(new Error(`petrel serve exited (${code}):\n${this.log}`)));
    });
    for (let i = 0; i < 300; ++i) {
      if ((await fetch(`${this.base}/health`)).status === 200) return this;
      await sleep(20);
    }
    throw new Error(`petrel serve never became ready:\n${this.log}`);
  }

  async post(path, body, headers = {}) {
    const response = await fetch(`${this.base}${path}`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${API_KEY}`, 'Content-Type': 'application/json', ...headers },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
    return { status: response.status, text: await response.text() };
  }

  async tokenCount(body) {
    const { status, text } = await this.post('/tokenize', body);
    assert.equal(status, 200, text);
    return JSON.parse(text).count;
  }

  async metrics() {
    const text = await (await fetch(`${this.base}/metrics`, { headers: { Authorization: `Bearer ${API_KEY}` } })).text();
    const values = {};
    for (const line of text.split('\n')) {
      const match = /^(\w+(?:\{[^}]*\})?) (\S+)$/.exec(line);
      if (match) values[match[1]] = Number(match[2]);
    }
    return values;
  }

  // Polls /metrics until `ok` holds (the scheduler frees slots just after the last event).
  async waitForMetrics(ok, what) {
    let values;
    for (let i = 0; i < 250; ++i) {
      values = await this.metrics();
      if (ok(values)) return values;
      await sleep(20);
    }
    assert.fail(`${what}; metrics: ${JSON.stringify(values)}`);
  }

  // Waits until `count` lines of the request log (stderr) match `pattern` (a regular expression
  // with the g and m flags); the server writes a line just after its response's last byte.
  async logLines(pattern, count = 1) {
    for (let i = 0; i < 250; ++i) {
      if ((this.log.match(pattern) ?? []).length >= count) return;
      await sleep(20);
    }
    assert.fail(`fewer than ${count} request log lines match ${pattern}:\n${this.log}`);
  }

  async stop(signal = 'SIGTERM') {
    if (this.process.exitCode === null) this.process.kill(signal);
    return this.exited;
  }
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
