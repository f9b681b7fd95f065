// Streaming client check with the official `openai` npm SDK: responses.stream() against Pulse
// must yield a well-ordered event sequence and a final response the SDK can assemble.
// usage: node openai_sdk_stream.mjs BASE_URL MODEL [PACKAGE]   (exit 0 = pass; prints what failed)
// PACKAGE: the installed name of the SDK to use (`openai` = 6.x, `openai7` = 7.x, the strict one).
const [baseURL, model, pkg = 'openai'] = process.argv.slice(2);
const { default: OpenAI } = await import(pkg);
const client = new OpenAI({ baseURL, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
const failures = [];
const check = (ok, what) => { if (!ok) failures.push(what); };

const stream = client.responses.stream({
  model,
  input: [{ role: 'user', content: 'run a command' }],
  tools: [{ type: 'function', name: 'exec_command', parameters: { type: 'object', properties: { cmd: { type: 'string' } } } }],
  store: false,
});
const types = [];
let seq = -1, textDeltas = '', argDeltas = '';
for await (const event of stream) {
  types.push(event.type);
  check(event.sequence_number === seq + 1, `sequence_number ${event.sequence_number} after ${seq}`);
  seq = event.sequence_number;
  if (event.type === 'response.output_text.delta') textDeltas += event.delta;
  if (event.type === 'response.function_call_arguments.delta') argDeltas += event.delta;
}
const final = await stream.finalResponse();

check(types[0] === 'response.created', `first event is ${types[0]}`);
check(types[1] === 'response.in_progress', `second event is ${types[1]}`);
check(types.at(-1) === 'response.completed', `last event is ${types.at(-1)}`);
check(final.status === 'completed', `final status ${final.status}`);
check(final.output_text === 'Running it now.', `output_text ${JSON.stringify(final.output_text)}`);
check(textDeltas === 'Running it now.', `text deltas ${JSON.stringify(textDeltas)}`);
const call = final.output.find((o) => o.type === 'function_call');
check(call && call.name === 'exec_command', 'no exec_command function_call in the final output');
check(call && JSON.parse(call.arguments).cmd === 'ls -la', `arguments ${call && call.arguments}`);
check(call && argDeltas === call.arguments, 'argument deltas differ from the final arguments');
check(call && /^call_/.test(call.call_id), `call_id ${call && call.call_id}`);
check(final.usage && Number.isInteger(final.usage.total_tokens) && final.usage.total_tokens > 0, 'usage.total_tokens');

// Non-streaming through the same SDK.
const plain = await client.responses.create({ model, input: 'again', stream: false, store: false });
check(plain.status === 'completed' && plain.object === 'response', `non-streaming status ${plain.status}`);

// An error the SDK must surface as an APIError with our message.
try {
  await client.responses.create({ model: 'no-such-model', input: 'x' });
  check(false, 'unknown model did not throw');
} catch (e) {
  check(e.status === 400 && /not configured here/.test(e.message), `unknown model error: ${e.status} ${e.message}`);
}

if (failures.length) {
  console.log('FAIL:\n  ' + failures.join('\n  ') + '\nevents: ' + types.join(' '));
  process.exit(1);
}
console.log(`openai SDK stream check: ok (${types.length} events, final status ${final.status})`);
