// The official Anthropic Node SDK against infera serve's /v1/messages
// (args: base URL, API key, model). Run by e2e/sdk_test.go.
'use strict';
const Anthropic = require('@anthropic-ai/sdk').default;
const { NotFoundError, BadRequestError, AuthenticationError } = require('@anthropic-ai/sdk');
const { run, rejects, assert } = require('./common.cjs');

const [base, key, model] = process.argv.slice(2);
const client = new Anthropic({ baseURL: base, apiKey: key, maxRetries: 0 });
const tools = [{ name: 'lookup', description: 'look a thing up', input_schema: { type: 'object', properties: { input: { type: 'string' } } } }];

run([
  ['messages', async () => {
    const m = await client.messages.create({ model, max_tokens: 5, system: 'be brief', messages: [{ role: 'user', content: 'hello anthropic sdk' }] });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.ok(m.id.startsWith('msg_'));
    assert.equal(m.stop_reason, 'max_tokens');
    assert.equal(m.content[0].type, 'text');
    assert.ok(m.content[0].text.length > 0);
    assert.equal(m.usage.output_tokens, 5);
    assert.ok(m.usage.input_tokens > 0);
  }],
  ['messages_stream_cached', async () => {
    const s = client.messages.stream({ model, max_tokens: 4, system: [{ type: 'text', text: 'be brief', cache_control: { type: 'ephemeral' } }], messages: [{ role: 'user', content: 'hello anthropic sdk' }] });
    let text = '';
    s.on('text', (t) => { text += t; });
    const m = await s.finalMessage();
    assert.ok(text.length > 0);
    assert.equal(m.content[0].text, text);
    assert.equal(m.stop_reason, 'max_tokens');
    assert.equal(m.usage.output_tokens, 4);
    // The prompt's prefix was cached by the request before.
    assert.ok(m.usage.cache_read_input_tokens > 0, `cache_read_input_tokens ${m.usage.cache_read_input_tokens}`);
  }],
  ['tool_round_trip', async () => {
    const messages = [{ role: 'user', content: 'please call_tool for me' }];
    const m = await client.messages.create({ model, max_tokens: 6, tools, tool_choice: { type: 'auto' }, messages });
    assert.equal(m.stop_reason, 'tool_use');
    const use = m.content.find((b) => b.type === 'tool_use');
    assert.ok(use, JSON.stringify(m.content));
    assert.equal(use.name, 'lookup');
    assert.deepEqual(use.input, { input: 'sim' });
    // Streamed: the SDK assembles the input from input_json_delta events.
    const s = await client.messages.stream({ model, max_tokens: 6, tools, messages }).finalMessage();
    const su = s.content.find((b) => b.type === 'tool_use');
    assert.ok(su, JSON.stringify(s.content));
    assert.deepEqual(su.input, { input: 'sim' });
    assert.equal(s.stop_reason, 'tool_use');
    messages.push({ role: 'assistant', content: m.content }, { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: '42' }] });
    const f = await client.messages.create({ model, max_tokens: 3, tools, messages });
    assert.equal(f.stop_reason, 'max_tokens');
    assert.equal(f.content[0].type, 'text');
  }],
  ['stop_sequences', async () => {
    // The simulator's answer to a prompt is fixed: a word from it, given as
    // a stop sequence, ends the answer there (stop → stop_sequence).
    const messages = [{ role: 'user', content: 'stop sequences please' }];
    const full = await client.messages.create({ model, max_tokens: 40, messages });
    const words = full.content[0].text.split(' ');
    assert.ok(words.length > 4, full.content[0].text);
    const seq = ' ' + words[3];
    const at = full.content[0].text.indexOf(seq);
    const m = await client.messages.create({ model, max_tokens: 40, stop_sequences: ['never in it', seq], messages });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, seq);
    assert.equal(m.content[0].text, full.content[0].text.slice(0, at));
    const s = await client.messages.stream({ model, max_tokens: 40, stop_sequences: [seq], messages }).finalMessage();
    assert.equal(s.stop_reason, 'stop_sequence');
    assert.equal(s.stop_sequence, seq);
    assert.equal(s.content[0].text, m.content[0].text);
    assert.equal(s.usage.output_tokens, m.usage.output_tokens);
  }],
  ['count_tokens', async () => {
    const r = await client.messages.countTokens({ model, messages: [{ role: 'user', content: 'hello anthropic sdk' }] });
    assert.ok(r.input_tokens > 0);
  }],
  ['errors', async () => {
    await rejects(client.messages.create({ model: 'no-such-model', max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }), NotFoundError, 404);
    const e = await rejects(client.messages.create({ model, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }), BadRequestError, 400);
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    const bad = new Anthropic({ baseURL: base, apiKey: 'wrong-key', maxRetries: 0 });
    await rejects(bad.messages.create({ model, max_tokens: 2, messages: [{ role: 'user', content: 'x' }] }), AuthenticationError, 401);
  }],
  // A Messages stream continued on another worker mid-way (run by
  // TestSDKStreamContinued): the SDK assembles one message with the text
  // of an unbroken run.
  ['messages_stream_continued', async () => {
    for (let i = 0; i < 3; i++) {
      const s = client.messages.stream({ model, max_tokens: Number(process.env.CONT_MAX_TOKENS), messages: [{ role: 'user', content: process.env.CONT_PROMPT }] });
      let text = '';
      s.on('text', (t) => { text += t; });
      const m = await s.finalMessage();
      assert.equal(text, process.env.CONT_TEXT);
      assert.equal(m.content.length, 1);
      assert.equal(m.content[0].text, text);
      assert.equal(m.stop_reason, 'max_tokens');
    }
  }],
]);
