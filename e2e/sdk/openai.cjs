// The official OpenAI Node SDK against infera serve (args: base URL, API
// key, model). Run by e2e/sdk_test.go.
'use strict';
const OpenAI = require('openai').default;
const { NotFoundError, BadRequestError, AuthenticationError } = require('openai');
const { run, rejects, assert } = require('./common.cjs');

const [base, key, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: key, maxRetries: 0 });
const tools = [{ type: 'function', function: { name: 'lookup', description: 'look a thing up', parameters: { type: 'object', properties: { input: { type: 'string' } } } } }];

run([
  ['chat', async () => {
    const r = await client.chat.completions.create({ model, max_tokens: 5, messages: [{ role: 'user', content: 'hello openai sdk' }] });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.ok(r.choices[0].message.content.length > 0);
    assert.equal(r.usage.completion_tokens, 5);
  }],
  ['chat_stream_usage', async () => {
    const s = await client.chat.completions.create({ model, max_tokens: 4, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'hello openai sdk' }] });
    let text = '', usage = null, finish = null;
    for await (const c of s) {
      if (c.choices.length > 0) {
        text += c.choices[0].delta.content || '';
        finish = c.choices[0].finish_reason || finish;
      }
      if (c.usage) usage = c.usage;
    }
    assert.ok(text.length > 0);
    assert.equal(finish, 'length');
    assert.ok(usage, 'include_usage: no usage chunk');
    assert.equal(usage.completion_tokens, 4);
    // The same prompt again: its prefix is in the engine's cache.
    assert.ok(usage.prompt_tokens_details.cached_tokens > 0, `cached_tokens ${usage.prompt_tokens_details.cached_tokens}`);
  }],
  ['completions', async () => {
    const r = await client.completions.create({ model, prompt: 'once upon a time', max_tokens: 3 });
    assert.equal(r.object, 'text_completion');
    assert.ok(r.choices[0].text.length > 0);
    const t = await client.completions.create({ model, prompt: [1, 2, 3, 4], max_tokens: 2 });
    assert.ok(t.choices[0].text.length > 0);
  }],
  ['tools_round_trip', async () => {
    const messages = [{ role: 'user', content: 'please call_tool for me' }];
    const r = await client.chat.completions.create({ model, max_tokens: 6, tools, tool_choice: 'auto', messages });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const call = r.choices[0].message.tool_calls[0];
    assert.equal(call.function.name, 'lookup');
    assert.deepEqual(JSON.parse(call.function.arguments), { input: 'sim' });
    // Streamed, the SDK's accumulated arguments are the same.
    const s = await client.chat.completions.create({ model, max_tokens: 6, tools, stream: true, messages });
    let args = '', name = '';
    for await (const c of s) {
      for (const tc of (c.choices[0] && c.choices[0].delta.tool_calls) || []) {
        if (tc.function.name) name = tc.function.name;
        args += tc.function.arguments || '';
      }
    }
    assert.equal(name, 'lookup');
    assert.deepEqual(JSON.parse(args), { input: 'sim' });
    messages.push(r.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '42' });
    const f = await client.chat.completions.create({ model, max_tokens: 3, tools, messages });
    assert.equal(f.choices[0].finish_reason, 'length');
    assert.ok(f.choices[0].message.content.length > 0);
  }],
  ['stop', async () => {
    const messages = [{ role: 'user', content: 'stop please' }];
    const full = await client.chat.completions.create({ model, max_tokens: 40, messages });
    const text = full.choices[0].message.content;
    const seq = ' ' + text.split(' ')[3];
    const r = await client.chat.completions.create({ model, max_tokens: 40, stop: [seq], messages });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].message.content, text.slice(0, text.indexOf(seq)));
  }],
  ['n_choices', async () => {
    // n: 2 choices, each with its index and text, usage summing both;
    // streamed, the chunks of the two choices interleave.
    const messages = [{ role: 'user', content: 'two answers please' }];
    const r = await client.chat.completions.create({ model, max_tokens: 6, n: 2, messages });
    assert.equal(r.choices.length, 2);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    assert.notEqual(r.choices[0].message.content, r.choices[1].message.content);
    r.choices.forEach((c) => assert.equal(c.finish_reason, 'length'));
    assert.equal(r.usage.completion_tokens, 12);
    const s = await client.chat.completions.create({ model, max_tokens: 6, n: 2, stream: true, stream_options: { include_usage: true }, messages });
    const text = ['', ''], finish = [null, null];
    let usage = null;
    for await (const c of s) {
      for (const ch of c.choices) {
        text[ch.index] += ch.delta.content || '';
        finish[ch.index] = ch.finish_reason || finish[ch.index];
      }
      if (c.usage) usage = c.usage;
    }
    assert.deepEqual(text, r.choices.map((c) => c.message.content));
    assert.deepEqual(finish, ['length', 'length']);
    assert.equal(usage.completion_tokens, 12);
    const t = await client.completions.create({ model, prompt: 'two endings', max_tokens: 4, n: 2 });
    assert.deepEqual(t.choices.map((c) => c.index), [0, 1]);
    assert.equal(t.usage.completion_tokens, 8);
  }],
  ['models_retrieve', async () => {
    const m = await client.models.retrieve(model);
    assert.equal(m.id, model);
    assert.equal(m.object, 'model');
    const list = await client.models.list();
    assert.ok(list.data.some((x) => x.id === model));
    await rejects(client.models.retrieve('no-such-model'), NotFoundError, 404);
  }],
  ['embeddings', async () => {
    // The SDK asks for base64 and decodes it; the simulator's vectors are
    // unit length and the same for the same input.
    const r = await client.embeddings.create({ model, input: ['hello sdk', 'other text', 'hello sdk'] });
    assert.equal(r.object, 'list');
    assert.equal(r.data.length, 3);
    const norm = r.data[0].embedding.reduce((s, x) => s + x * x, 0);
    assert.ok(Math.abs(norm - 1) < 1e-4, `norm ${norm}`);
    assert.deepEqual(r.data[0].embedding, r.data[2].embedding);
    assert.notDeepEqual(r.data[0].embedding, r.data[1].embedding);
    assert.ok(r.usage.prompt_tokens > 0);
    const f = await client.embeddings.create({ model, input: 'hello sdk', encoding_format: 'float' });
    assert.equal(f.data[0].embedding.length, r.data[0].embedding.length);
    f.data[0].embedding.forEach((x, i) => assert.ok(Math.abs(x - r.data[0].embedding[i]) < 1e-6));
  }],
  ['errors', async () => {
    await rejects(client.chat.completions.create({ model: 'no-such-model', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }), NotFoundError, 404);
    await rejects(client.chat.completions.create({ model, max_tokens: -1, messages: [{ role: 'user', content: 'x' }] }), BadRequestError, 400);
    const bad = new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong-key', maxRetries: 0 });
    await rejects(bad.chat.completions.create({ model, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }), AuthenticationError, 401);
  }],
  // Streams that break mid-way on their engine and are continued on
  // another worker (run by TestSDKStreamContinued): the SDK reads one
  // unbroken stream, the text of an unbroken run (CONT_TEXT), one finish.
  ['chat_stream_continued', async () => {
    for (let i = 0; i < 3; i++) {
      const s = await client.chat.completions.create({ model, max_tokens: Number(process.env.CONT_MAX_TOKENS), stream: true, messages: [{ role: 'user', content: process.env.CONT_PROMPT }] });
      let text = '', finish = null;
      for await (const c of s) {
        if (c.choices.length > 0) {
          text += c.choices[0].delta.content || '';
          finish = c.choices[0].finish_reason || finish;
        }
      }
      assert.equal(text, process.env.CONT_TEXT);
      assert.equal(finish, 'length');
    }
  }],
]);
