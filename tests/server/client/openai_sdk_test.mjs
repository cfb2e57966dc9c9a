// The official OpenAI Node SDK against `petrel serve` on the bundled petrel-tiny model: chat and
// completions (whole and streamed), usage, stop strings, logprobs, 32 concurrent streams, a client
// that leaves mid-stream, the bad-request table (bad_requests.json), a fuzz run, a full queue and
// a graceful shutdown.
//
//   node tests/server/client/openai_sdk_test.mjs build/src/petrel models/petrel-tiny
//
// The SDK comes from scripts/fetch-test-data.sh (npm ci in this folder).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';

import { API_KEY, Server, sleep } from './serve.mjs';

const { default: OpenAI } = await import('openai').catch(() => {
  throw new Error('the OpenAI SDK is missing from tests/server/client/node_modules: run scripts/fetch-test-data.sh');
});

const [petrel, modelDir] = process.argv.slice(2);
if (!petrel || !modelDir) throw new Error('usage: node openai_sdk_test.mjs PETREL_BINARY MODEL_DIR');

const MODEL = 'petrel-tiny';
const sdkClient = (server) =>
  new OpenAI({ baseURL: `${server.base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 60000 });
const EOS = 2; // <|im_end|>
const table = JSON.parse(readFileSync(new URL('../bad_requests.json', import.meta.url)));

const ask = (question) => [{ role: 'user', content: question }];
const rawPrompt = (question) => `<|im_start|>user\n${question}<|im_end|>\n<|im_start|>assistant\n`;

async function collect(stream) {
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  return chunks;
}

const chatText = (chunks) => chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
const lastChoice = (chunks) => chunks.filter((c) => c.choices.length > 0).at(-1).choices[0];

describe('petrel serve with the OpenAI SDK', () => {
  let server, openai;
  before(async () => {
    // Prompts go in 16-token pieces between decode steps; the model's chunk still holds 32 rows.
    server = await new Server(petrel, modelDir, ['--api-key', API_KEY, '--max-sequences', '32', '--context', '2048',
                               '--chunk', '16', '--max-body', '1000000']).start();
    openai = sdkClient(server);
  });
  after(async () => assert.equal(await server.stop(), 0, server.log));

  test('lists the model', async () => {
    const models = await openai.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
  });

  test('chat answers, and usage counts what /tokenize counts', async () => {
    const messages = ask('What is 48213 + 9377?');
    const r = await openai.chat.completions.create({ model: MODEL, messages, temperature: 0 });
    const answer = r.choices[0].message.content;
    assert.equal(answer, 'Digits from the right: 09575\nAnswer: 57590');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.usage.prompt_tokens, await server.tokenCount({ messages }));
    // The answer's tokens plus the end-of-turn token that ended it.
    assert.equal(r.usage.completion_tokens, await server.tokenCount({ prompt: answer }) + 1);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  });

  test('a conversation with tool calls and tool results goes through the template', async () => {
    const messages = [
      { role: 'user', content: 'What is 2 + 2?' },
      { role: 'assistant', content: null,
        tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'add', arguments: '{"a": 2, "b": 2}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: '4' },
      { role: 'user', content: 'What is 3 + 5?' },
    ];
    const tools = [{ type: 'function', function: { name: 'add', description: 'Adds two integers',
                     parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } } } } }];
    const r = await openai.chat.completions.create({ model: MODEL, messages, tools, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, await server.tokenCount({ messages, tools }));
    assert.equal(r.choices[0].finish_reason, 'stop'); // petrel-tiny never calls tools
    assert.match(r.choices[0].message.content, /Answer: 8$/);
  });

  test('a streamed chat answer equals the whole one, usage last', async () => {
    const body = { model: MODEL, messages: ask('Reverse the word petrel.'), temperature: 0 };
    const whole = await openai.chat.completions.create(body);
    const chunks = await collect(await openai.chat.completions.create({
      ...body, stream: true, stream_options: { include_usage: true } }));
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    assert.equal(chatText(chunks), whole.choices[0].message.content);
    assert.equal(whole.choices[0].message.content, 'lertep');
    assert.equal(lastChoice(chunks).finish_reason, 'stop');
    assert.deepEqual(chunks.at(-1).usage, whole.usage);
    assert.ok(chunks.slice(0, -1).every((c) => c.usage === null));
    // One request log line each, the whole and the streamed answer, with the usage counts.
    const { prompt_tokens: prompt, completion_tokens: completion } = whole.usage;
    const line = new RegExp(`^\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{3}Z POST /v1/chat/completions 200 ` +
                            `prompt_tokens=${prompt} completion_tokens=${completion} duration_ms=[\\d.]+ ` +
                            `client=127\\.0\\.0\\.1:\\d+$`, 'gm');
    await server.logLines(line, 2);
  });

  test('the next turn of a conversation reuses the prefilled history and says so in usage', async () => {
    // A system prompt of over two cache blocks (64 tokens each): the second turn restores it.
    const system = { role: 'system', content: 'Answer exactly. '.repeat(40) };
    const first = [system, ...ask('What is 48213 + 9377?')];
    const a = await openai.chat.completions.create({ model: MODEL, messages: first, temperature: 0 });
    assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
    const hitsBefore = (await server.metrics())['petrel_prefix_cache_hits_total'];
    const second = [...first, a.choices[0].message, ...ask('Reverse the word petrel.')];
    const b = await openai.chat.completions.create({ model: MODEL, messages: second, temperature: 0 });
    const cached = b.usage.prompt_tokens_details.cached_tokens;
    assert.ok(cached >= 128 && cached % 64 === 0 && cached < b.usage.prompt_tokens, JSON.stringify(b.usage));
    const hits = (await server.metrics())['petrel_prefix_cache_hits_total'];
    assert.equal(hits - hitsBefore, cached);
    // The same answer as a server without the cache gives: the history's state was restored exactly.
    const plain = await new Server(petrel, modelDir, ['--prefix-cache-mb', '0']).start();
    try {
      const c = await sdkClient(plain).chat.completions.create({ model: MODEL, messages: second, temperature: 0 });
      assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(c.choices[0].message.content, b.choices[0].message.content);
    } finally {
      assert.equal(await plain.stop(), 0, plain.log);
    }
  });

  test('completions, whole and streamed, on the templated prompt', async () => {
    const prompt = rawPrompt('Sort 42, 7, 19, 3 from smallest to largest.');
    const whole = await openai.completions.create({ model: MODEL, prompt, temperature: 0 });
    assert.equal(whole.choices[0].text, '3, 7, 19, 42');
    assert.equal(whole.choices[0].finish_reason, 'stop');
    assert.equal(whole.usage.prompt_tokens, await server.tokenCount({ prompt }));
    const chunks = await collect(await openai.completions.create({ model: MODEL, prompt, temperature: 0, stream: true }));
    assert.equal(chunks.map((c) => c.choices[0].text).join(''), whole.choices[0].text);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  });

  test('max_tokens ends the answer with finish_reason length', async () => {
    const r = await openai.chat.completions.create({
      model: MODEL, messages: ask('What is 48213 + 9377?'), max_completion_tokens: 5, temperature: 0 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 5);
    assert.ok(r.choices[0].message.content.startsWith('Digits from'), r.choices[0].message.content);
  });

  test('stop strings end the answer across token boundaries and are never sent', async () => {
    // Digits are single tokens: "575" spans three of them.
    const body = { model: MODEL, messages: ask('What is 48213 + 9377?'), temperature: 0, stop: ['575', 'never'] };
    const whole = await openai.chat.completions.create(body);
    assert.equal(whole.choices[0].message.content, 'Digits from the right: 09');
    assert.equal(whole.choices[0].finish_reason, 'stop');
    const chunks = await collect(await openai.chat.completions.create({ ...body, stream: true }));
    assert.equal(chatText(chunks), 'Digits from the right: 09');
    const text = await openai.completions.create({
      model: MODEL, prompt: rawPrompt('What is 48213 + 9377?'), temperature: 0, stop: '\n' });
    assert.equal(text.choices[0].text, 'Digits from the right: 09575');
  });

  test('logprobs in the chat form and the legacy form', async () => {
    const chat = await openai.chat.completions.create({
      model: MODEL, messages: ask('Reverse the word cat.'), temperature: 0, logprobs: true, top_logprobs: 2 });
    const content = chat.choices[0].logprobs.content;
    assert.equal(content.map((t) => t.token).join(''), chat.choices[0].message.content);
    assert.equal(content.length + 1, chat.usage.completion_tokens); // the end-of-turn token has none
    for (const t of content) {
      assert.ok(t.logprob <= 0);
      assert.equal(t.top_logprobs.length, 2);
      assert.equal(t.top_logprobs[0].token, t.token); // greedy: the chosen token is the most likely
      assert.deepEqual(Buffer.from(t.bytes).toString(), t.token);
    }
    const text = await openai.completions.create({
      model: MODEL, prompt: rawPrompt('Reverse the word cat.'), temperature: 0, logprobs: 1 });
    const lp = text.choices[0].logprobs;
    assert.equal(lp.tokens.join(''), text.choices[0].text);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    assert.deepEqual(lp.text_offset, lp.tokens.map((_, i) => lp.tokens.slice(0, i).join('').length));
    assert.ok(lp.top_logprobs.every((top) => Object.keys(top).length === 1));
  });

  test('a seed repeats a sampled answer', async () => {
    const body = { model: MODEL, prompt: rawPrompt('Spell petrel backwards.'), temperature: 1.5, seed: 42,
                   max_tokens: 24, logit_bias: { [EOS]: -100 } };
    const a = await openai.completions.create(body);
    const b = await openai.completions.create(body);
    assert.equal(a.choices[0].text, b.choices[0].text);
    assert.equal(a.usage.completion_tokens, 24);
  });

  test('32 concurrent greedy streams each equal the same request alone; nothing is held afterwards', async () => {
    const questions = Array.from({ length: 32 }, (_, i) => `What is ${1000 + 37 * i} + ${250 + 11 * i}?`);
    const body = (q) => ({ model: MODEL, messages: ask(q), temperature: 0, max_tokens: 40 });
    const alone = [];
    for (const q of questions) alone.push((await openai.chat.completions.create(body(q))).choices[0].message.content);
    const together = await Promise.all(questions.map(async (q) =>
      chatText(await collect(await openai.chat.completions.create({ ...body(q), stream: true })))));
    assert.deepEqual(together, alone);
    assert.match(alone[0], /^Digits from the right: 0521\nAnswer: 1250$/);
    await server.waitForMetrics((m) => m.petrel_slots_in_use === 0 && m.petrel_kv_tokens_in_use === 0 &&
                                       m.petrel_sequences_running === 0 && m.petrel_sequences_queued === 0,
                                'slots or KV tokens still in use after every stream ended');
  });

  test('a client that leaves mid-stream frees its slot', async () => {
    const cancelledBefore = (await server.metrics())['petrel_requests_finished_total{reason="cancelled"}'] ?? 0;
    const stream = await openai.completions.create({
      model: MODEL, prompt: rawPrompt('What is 1 + 1?'), stream: true, max_tokens: 2000, logit_bias: { [EOS]: -100 } });
    let chunks = 0;
    for await (const _ of stream) {
      if (++chunks === 5) break; // leaving the loop aborts the request
    }
    await server.waitForMetrics(
      (m) => m.petrel_slots_in_use === 0 && m['petrel_requests_finished_total{reason="cancelled"}'] === cancelledBefore + 1,
      'the abandoned stream was not cancelled');
  });

  test('every request of the bad-request table gets its status and names its field', async () => {
    for (const entry of table.bad) {
      const { status, text } = await server.post(entry.endpoint, entry.raw ?? entry.body);
      assert.equal(status, entry.status, `${entry.name}: ${text}`);
      const { error } = JSON.parse(text);
      assert.equal(error.param, entry.param, `${entry.name}: ${text}`);
      assert.equal(typeof error.message, 'string');
      assert.equal(typeof error.type, 'string');
      assert.ok('code' in error);
    }
    const r = await openai.chat.completions.create({ model: MODEL, messages: ask('What is 2 + 2?'), temperature: 0 });
    assert.match(r.choices[0].message.content, /Answer: 4$/);
  });

  test('the SDK sees errors as typed exceptions', async () => {
    await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: ask('hi'), n: 2 }),
                         (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
    await assert.rejects(openai.chat.completions.create({ model: 'gpt-4', messages: ask('hi') }),
                         (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
    const stranger = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(stranger.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  });

  test('long prompts, large bodies, unknown routes and missing keys', async () => {
    const long = await server.post('/v1/completions', { model: MODEL, prompt: '1 + '.repeat(1100) });
    assert.equal(long.status, 400, long.text);
    assert.equal(JSON.parse(long.text).error.code, 'context_length_exceeded');
    assert.equal(JSON.parse(long.text).error.param, 'prompt');
    const longChat = await server.post('/v1/chat/completions', { messages: ask('1 + '.repeat(1100)) });
    assert.equal(JSON.parse(longChat.text).error.param, 'messages');
    const large = await server.post('/v1/completions', { prompt: 'x'.repeat(1100000) });
    assert.equal(large.status, 413, large.text);
    const unknown = await server.post('/v1/embeddings', { input: 'x' });
    assert.equal(unknown.status, 404);
    assert.equal(JSON.parse(unknown.text).error.code, 'not_found');
    const anonymous = await fetch(`${server.base}/v1/models`);
    assert.equal(anonymous.status, 401);
    assert.equal((await anonymous.json()).error.type, 'authentication_error');
    assert.equal((await fetch(`${server.base}/health`)).status, 200); // no key needed
  });

  test('fuzz: mutated request bodies get only 2xx and 4xx answers', async () => {
    const random = mulberry32(20261130);
    const bases = [
      ['/v1/chat/completions', { model: MODEL, messages: ask('What is 12 + 34?'), max_tokens: 8, temperature: 0 }],
      ['/v1/chat/completions', { model: MODEL, messages: ask('Reverse the word cat.'), stream: true, max_tokens: 8,
                                  stop: ['x'], logprobs: true, top_logprobs: 1 }],
      ['/v1/completions', { model: MODEL, prompt: rawPrompt('Sort 3, 1, 2.'), max_tokens: 8, seed: 1 }],
      ['/v1/completions', { model: MODEL, prompt: [1, 269, 201], stream: true, max_tokens: 8, logprobs: 2 }],
    ];
    const requests = Array.from({ length: 400 }, () => {
      const [path, body] = bases[Math.floor(random() * bases.length)];
      return [path, mutate(body, random)];
    });
    const statuses = {};
    for (let i = 0; i < requests.length; i += 8) {
      await Promise.all(requests.slice(i, i + 8).map(async ([path, body]) => {
        const { status, text } = await server.post(path, body);
        statuses[status] = (statuses[status] ?? 0) + 1;
        assert.ok(status >= 200 && status < 500, `${status} for ${body}: ${text}`);
        if (status >= 400) assert.equal(typeof JSON.parse(text).error.message, 'string');
        else if (text.startsWith('data:')) assert.ok(text.endsWith('data: [DONE]\n\n'), text);
        else JSON.parse(text);
      }));
    }
    assert.ok(statuses[200] > 20 && statuses[400] > 20, JSON.stringify(statuses));
    const r = await openai.chat.completions.create({ model: MODEL, messages: ask('What is 2 + 2?'), temperature: 0 });
    assert.match(r.choices[0].message.content, /Answer: 4$/);
    await server.waitForMetrics((m) => m.petrel_slots_in_use === 0, 'slots still in use after the fuzz run');
  });
});

describe('petrel serve under pressure', () => {
  let server, openai;
  before(async () => {
    server = await new Server(petrel, modelDir, ['--max-sequences', '1', '--max-queued', '1', '--context', '1024',
                               '--shutdown-timeout', '60']).start();
    openai = sdkClient(server);
  });
  after(async () => server.stop('SIGKILL'));

  const long = (tokens) => ({ model: MODEL, prompt: rawPrompt('What is 1 + 1?'), max_tokens: tokens,
                              logit_bias: { [EOS]: -100 } });

  test('a full queue answers 429', async () => {
    const results = await Promise.allSettled([1, 2, 3].map(() => openai.completions.create(long(300))));
    const refused = results.filter((r) => r.status === 'rejected');
    assert.equal(refused.length, 1, JSON.stringify(results.map((r) => r.status)));
    assert.ok(refused[0].reason instanceof OpenAI.RateLimitError);
    assert.equal(refused[0].reason.code, 'queue_full');
    for (const r of results.filter((r) => r.status === 'fulfilled')) assert.equal(r.value.usage.completion_tokens, 300);
  });

  test('SIGTERM lets the running request finish, refuses new ones, and exits 0', async () => {
    const running = openai.completions.create(long(400));
    await server.waitForMetrics((m) => m.petrel_slots_in_use === 1, 'the request never started');
    server.process.kill('SIGTERM');
    await sleep(100);
    const refused = await fetch(`${server.base}/v1/completions`, { method: 'POST', body: JSON.stringify(long(1)) });
    assert.equal(refused.status, 503);
    assert.equal((await fetch(`${server.base}/health`)).status, 503);
    const finished = await running;
    assert.equal(finished.choices[0].finish_reason, 'length');
    assert.equal(finished.usage.completion_tokens, 400);
    assert.equal(await server.exited, 0, server.log);
  });
});

// A small seeded generator, so that the fuzz run is the same every time.
function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const FIELDS = ['model', 'messages', 'prompt', 'max_tokens', 'temperature', 'top_p', 'top_k', 'min_p', 'stop', 'seed',
                'stream', 'stream_options', 'logprobs', 'top_logprobs', 'logit_bias', 'n', 'presence_penalty',
                'frequency_penalty', 'repetition_penalty', 'tools', 'tool_choice', 'chat_template_kwargs', 'echo'];

function randomValue(random, depth = 0) {
  const pick = Math.floor(random() * 14);
  const choices = [
    () => null, () => true, () => false, () => 0, () => -1, () => 3.75, () => 1e20, () => -2147483649,
    () => '', () => 'ünï €😀 <tool_call>'.repeat(1 + Math.floor(random() * 3)), () => [1, 2, 3],
    () => (depth < 3 ? [randomValue(random, depth + 1)] : []),
    () => (depth < 3 ? { role: 'user', content: randomValue(random, depth + 1) } : {}),
    () => Math.floor(random() * 500),
  ];
  return choices[pick]();
}

// Every container path of `value`, to pick a place to mutate.
function paths(value, prefix = []) {
  if (value === null || typeof value !== 'object') return [];
  return [prefix, ...Object.keys(value).flatMap((k) => paths(value[k], [...prefix, k]))];
}

// One to three random edits of the JSON tree, and sometimes of the text itself.
function mutate(body, random) {
  const copy = structuredClone(body);
  for (let edits = 1 + Math.floor(random() * 3); edits > 0; --edits) {
    const containers = paths(copy);
    const path = containers[Math.floor(random() * containers.length)];
    const target = path.reduce((node, key) => node[key], copy);
    const keys = Object.keys(target);
    const key = random() < 0.3 || keys.length === 0 ? FIELDS[Math.floor(random() * FIELDS.length)]
                                                     : keys[Math.floor(random() * keys.length)];
    if (random() < 0.2) delete target[key];
    else target[key] = randomValue(random);
  }
  let text = JSON.stringify(copy);
  const roll = random();
  if (roll < 0.1) text = text.slice(0, Math.floor(random() * text.length));
  else if (roll < 0.2) {
    const at = Math.floor(random() * text.length);
    text = text.slice(0, at) + String.fromCharCode(32 + Math.floor(random() * 95)) + text.slice(at + 1);
  }
  return text;
}
