// Structured outputs through the OpenAI Node SDK against `petrel serve` on petrel-tiny: 200 sampled
// answers held to JSON schemas (nested objects, arrays, enums, required fields, number ranges,
// string patterns and formats) must each parse and validate with ajv; forced tool calls carry
// arguments that validate against their tool's parameters; unsupported keywords are 400s naming
// the keyword and where it is.
//
//   node tests/server/client/structured_outputs_test.mjs build/src/petrel models/petrel-tiny
//
// The SDK and ajv come from scripts/fetch-test-data.sh (npm ci in this folder).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { API_KEY, Server } from './serve.mjs';

const load = (name) => import(name).catch(() => {
  throw new Error(`${name} is missing from tests/server/client/node_modules: run scripts/fetch-test-data.sh`);
});
const { default: OpenAI } = await load('openai');
const { default: Ajv } = await load('ajv/dist/2020.js');
const { default: addFormats } = await load('ajv-formats');

const [petrel, modelDir] = process.argv.slice(2);
if (!petrel || !modelDir) throw new Error('usage: node structured_outputs_test.mjs PETREL_BINARY MODEL_DIR');

const MODEL = 'petrel-tiny';
const ajv = new Ajv({ strict: true, allErrors: true });
addFormats(ajv);

// Every schema bounds its strings and arrays, so that a sampled answer always ends within max_tokens.
const SCHEMAS = {
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 10 },
      age: { type: 'integer', minimum: 0, maximum: 120 },
      email: { type: 'string', format: 'email' },
      tags: { type: 'array', items: { enum: ['admin', 'user', 'guest'] }, maxItems: 3 },
    },
    required: ['name', 'age'],
    additionalProperties: false,
  },
  order: {
    type: 'object',
    properties: {
      id: { type: 'string', format: 'uuid' },
      lines: {
        type: 'array', minItems: 1, maxItems: 3,
        items: {
          type: 'object',
          properties: {
            sku: { type: 'string', pattern: '^[A-Z]{3}-\\d{3}$' },
            qty: { type: 'integer', minimum: 1, maximum: 99 },
            price: { type: 'number', minimum: 0, maximum: 1000 },
          },
          required: ['sku', 'qty', 'price'],
          additionalProperties: false,
        },
      },
      status: { enum: ['new', 'paid', 'shipped'] },
      shipping: {
        type: 'object',
        properties: { date: { type: 'string', format: 'date' }, express: { type: 'boolean' } },
        required: ['date', 'express'],
        additionalProperties: false,
      },
    },
    required: ['id', 'lines', 'status', 'shipping'],
    additionalProperties: false,
  },
  ranges: {
    type: 'object',
    properties: {
      p: { type: 'number', minimum: 0, maximum: 1 },
      t: { type: 'number', exclusiveMinimum: -40, exclusiveMaximum: 60 },
      n: { type: 'integer', minimum: -1000, maximum: -10 },
      k: { type: 'integer', exclusiveMinimum: 5, maximum: 4321 },
      x: { type: 'number', exclusiveMinimum: 0, exclusiveMaximum: 1 },
    },
    required: ['p', 't', 'n', 'k', 'x'],
    additionalProperties: false,
  },
  choices: {
    type: 'object',
    properties: {
      kind: { const: 'point' },
      color: { enum: ['red', 'green', 'blue'] },
      level: { enum: [1, 2, 3, null] },
      value: { anyOf: [{ type: 'integer', minimum: 0, maximum: 9 }, { type: 'string', maxLength: 3 }, { type: 'null' }] },
      flag: { type: ['boolean', 'null'] },
    },
    required: ['kind', 'color', 'level', 'value', 'flag'],
    additionalProperties: false,
  },
  shapes: {
    $defs: {
      point: {
        type: 'object',
        properties: { x: { type: 'integer', minimum: -9, maximum: 9 }, y: { type: 'integer', minimum: -9, maximum: 9 } },
        required: ['x', 'y'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: {
      from: { $ref: '#/$defs/point' },
      to: { $ref: '#/$defs/point' },
      label: { type: 'string', pattern: '^[a-z]{2,6}$' },
    },
    required: ['from', 'to'],
    additionalProperties: false,
  },
  tuple: {
    type: 'array',
    prefixItems: [{ type: 'string', pattern: '^id-\\d{1,4}$' }, { type: 'integer', minimum: 0, maximum: 50 },
                  { type: 'boolean' }],
    items: false,
    minItems: 3,
  },
  events: {
    type: 'object',
    properties: {
      when: { type: 'string', format: 'date-time' },
      codes: { type: 'array', items: { type: 'string', pattern: '^[A-F0-9]{2}$' }, minItems: 2, maxItems: 4 },
    },
    required: ['when', 'codes'],
    additionalProperties: false,
  },
  list: { type: 'array', items: { type: 'integer', minimum: 100, maximum: 999 }, minItems: 1, maxItems: 5 },
};

const PROMPTS = ['Describe a person as JSON.', 'What is 48213 + 9377?', 'Reverse the word petrel.', 'Sort 42, 7, 19, 3.'];

const sdk = (server) => new OpenAI({ baseURL: `${server.base}/v1`, apiKey: API_KEY, maxRetries: 0, timeout: 120000 });

function expectValid(name, text) {
  let value;
  assert.doesNotThrow(() => { value = JSON.parse(text); }, `${name}: not JSON: ${text}`);
  const validate = ajv.compile(SCHEMAS[name]);
  assert.ok(validate(value), `${name}: ${text}\n${JSON.stringify(validate.errors)}`);
}

describe('structured outputs on petrel-tiny', () => {
  let server, openai;
  before(async () => {
    server = await new Server(petrel, modelDir, ['--api-key', API_KEY, '--max-sequences', '16', '--context', '1024']).start();
    openai = sdk(server);
  });
  after(async () => assert.equal(await server.stop(), 0, server.log));

  test('200 sampled answers parse and validate against their schemas', async () => {
    const names = Object.keys(SCHEMAS);
    const jobs = [];
    for (let i = 0; i < 200; ++i) {
      const name = names[i % names.length];
      jobs.push(async () => {
        const r = await openai.chat.completions.create({
          model: MODEL, messages: [{ role: 'user', content: PROMPTS[i % PROMPTS.length] }],
          temperature: i < names.length ? 0 : 1, seed: i, max_tokens: 600,
          response_format: { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name], strict: true } },
        });
        assert.equal(r.choices[0].finish_reason, 'stop', `${name}: ${r.choices[0].message.content}`);
        expectValid(name, r.choices[0].message.content);
      });
    }
    // 16 at a time: one batch per decode step, as many as the server has slots.
    for (let i = 0; i < jobs.length; i += 16) await Promise.all(jobs.slice(i, i + 16).map((job) => job()));
  });

  test('a streamed answer validates too', async () => {
    const stream = await openai.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hi' }], stream: true, temperature: 1, seed: 5,
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema: SCHEMAS.person } },
    });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expectValid('person', text);
  });

  test('json_object gives an object', async () => {
    const r = await openai.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hi' }], temperature: 0, max_tokens: 300,
      response_format: { type: 'json_object' },
    });
    if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(r.choices[0].message.content), 'object');
    else assert.match(r.choices[0].message.content, /^\{/);
  });

  test('forced tool calls carry arguments valid for their tool', async () => {
    const tools = [
      { type: 'function', function: { name: 'add', parameters: SCHEMAS.ranges } },
      { type: 'function', function: { name: 'draw', parameters: SCHEMAS.shapes } },
    ];
    for (let i = 0; i < 10; ++i) {
      const named = i % 2 === 0;
      const r = await openai.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'What is 2 + 2?' }], tools, temperature: 1, seed: i,
        tool_choice: named ? { type: 'function', function: { name: 'draw' } } : 'required',
      });
      const choice = r.choices[0];
      assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
      assert.equal(choice.message.tool_calls.length, 1);
      const call = choice.message.tool_calls[0].function;
      if (named) assert.equal(call.name, 'draw');
      expectValid(call.name === 'add' ? 'ranges' : 'shapes', call.arguments);
    }
  });

  test('unsupported schemas and tool choices are 400s naming the field', async () => {
    const ask = (extra) => server.post('/v1/chat/completions',
                                       { model: MODEL, messages: [{ role: 'user', content: 'Hi' }], ...extra });
    const cases = [
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object',
         properties: { a: { type: 'integer', multipleOf: 3 } } } } } },
       'response_format.json_schema.schema.properties.a', /multipleOf/],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', format: 'ipv4' } } } },
       'response_format.json_schema.schema', /ipv4/],
      [{ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format.json_schema.schema', /schema/],
      [{ response_format: { type: 'yaml' } }, 'response_format.type', /yaml/],
      [{ tool_choice: 'required' }, 'tool_choice', /needs tools/],
      [{ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: { type: 'function', function: { name: 'g' } } },
       'tool_choice.function.name', /'g'/],
      [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { not: {} } } } } }],
         tool_choice: 'required' }, 'tools[0].function.parameters.properties.a', /'not'/],
    ];
    for (const [extra, param, message] of cases) {
      const { status, text } = await ask(extra);
      assert.equal(status, 400, text);
      const error = JSON.parse(text).error;
      assert.equal(error.param, param, text);
      assert.match(error.message, message);
    }
  });
});
