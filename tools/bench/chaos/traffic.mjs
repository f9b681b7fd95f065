// The clients of a chaos run: multi-turn conversations of Codex-shaped traffic through the
// official openai SDK's stream parser, retried the way Codex retries, with every turn's
// invariants checked as it ends.
//
// Codex's two retry layers (measured on the real CLI): HTTP-level retries of 5xx and transport
// errors (request_max_retries, default 4: the SDK's maxRetries does the same, honouring
// Retry-After), and turn-level retries (stream_max_retries, default 5) of a stream that ends
// without response.completed, of response.failed (but for context_length_exceeded and quota
// codes) and of an idle stream. response.incomplete is final, never retried. Messages a failed
// stream already finished (output_item.done) stay in the history the retry sends.
import { createRequire } from 'node:module';

const IDLE_FATAL_CODES = new Set(['context_length_exceeded', 'insufficient_quota', 'usage_not_included']);

export const TOOLS = [
  { type: 'function', name: 'exec_command', description: 'Runs a shell command and returns its output.', strict: false,
    parameters: { type: 'object', properties: { cmd: { type: 'string' }, workdir: { type: 'string' } }, required: ['cmd'] } },
  { type: 'custom', name: 'apply_patch', description: 'Edits files with a patch.',
    format: { type: 'grammar', syntax: 'lark', definition: 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\nhunk: /(.|\\n)+?/\n%import common.LF' } },
];

// Text long enough that its prefill takes time (a repository listing, a file, a request).
export function longPrompt(rng, chars) {
  const words = ['src', 'tests', 'build', 'gateway', 'stream', 'resume', 'token', 'config', 'plugin', 'server', 'client', 'retry',
    'window', 'endpoint', 'model', 'slot', 'cache', 'prefill', 'answer', 'patch'];
  let s = 'Here is the repository state, then the task.\n';
  while (s.length < chars) {
    const n = 4 + Math.floor(rng() * 8);
    const line = [];
    for (let i = 0; i < n; i++) line.push(words[Math.floor(rng() * words.length)]);
    s += line.join(' ') + '.\n';
  }
  return s.slice(0, chars) + '\nTask: explain what this code does.';
}

// The SDK classes, from the test tooling's node_modules (tools/test-deps).
export function loadSdk(nodeModules, pkg) {
  const require = createRequire(`${nodeModules}/`);
  return require(pkg);
}

// One attempt's stream, read through the SDK: the events, and what went wrong, if anything.
async function streamOnce(OpenAI, opts, body, idleMs, tally) {
  const attempt = { fetches: [], events: [], error: null, idle: false };
  const abort = new AbortController();
  let idleTimer = null;
  const arm = () => {
    clearTimeout(idleTimer);
    idleTimer = setTimeout(() => { attempt.idle = true; abort.abort(); }, idleMs);
  };
  // Every HTTP request the SDK makes (its own retries included), with its status.
  const fetchSpy = async (url, init) => {
    const f = { t: Date.now(), generation: opts.generation(), status: 0, outcome: 'unreached' };
    attempt.fetches.push(f);
    tally.push(f);
    try {
      const res = await fetch(url, init);
      f.status = res.status;
      f.outcome = res.status === 200 ? 'streaming' : `http_${res.status}`;
      return res;
    } catch (e) {
      f.outcome = 'unreached';
      throw e;
    }
  };
  const client = new OpenAI({ baseURL: opts.baseURL, apiKey: 'chaos', maxRetries: opts.requestMaxRetries, timeout: opts.headTimeoutMs, fetch: fetchSpy });
  try {
    const stream = await client.responses.create({ ...body, stream: true }, { signal: abort.signal });
    arm();
    for await (const ev of stream) {
      arm();
      attempt.events.push(ev);
    }
  } catch (e) {
    attempt.error = attempt.idle ? new Error(`idle: no event for ${idleMs} ms`) : e;
  } finally {
    clearTimeout(idleTimer);
  }
  const last = attempt.fetches.at(-1);
  const terminal = attempt.events.find((e) => e.type === 'response.completed' || e.type === 'response.incomplete' || e.type === 'response.failed');
  if (last && last.status === 200) last.outcome = terminal ? terminal.type.slice('response.'.length) : 'cut';
  return attempt;
}

// The invariants of one finished stream (terminal event completed or incomplete): a list of
// what does not hold.
export function checkStream(events, body) {
  const bad = [];
  const terminals = events.filter((e) => ['response.completed', 'response.incomplete', 'response.failed'].includes(e.type));
  if (terminals.length !== 1) bad.push(`${terminals.length} terminal events`);
  if (events.at(-1) !== terminals[0]) bad.push('events after the terminal event');
  if (events[0]?.type !== 'response.created') bad.push(`first event ${events[0]?.type}`);
  events.forEach((e, i) => { if (e.sequence_number !== i) bad.push(`event ${i} has sequence_number ${e.sequence_number}`); });
  const final = terminals[0]?.response;
  if (!final) return bad;
  if (final.status === 'incomplete' && final.incomplete_details?.reason !== 'max_output_tokens')
    bad.push(`incomplete for ${final.incomplete_details?.reason}, not the budget`);
  if (body.max_output_tokens && final.usage && final.usage.output_tokens > body.max_output_tokens)
    bad.push(`${final.usage.output_tokens} output tokens over max_output_tokens ${body.max_output_tokens}`);
  // Streamed items are the final response's items: same ids, call ids, names, text.
  const done = events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item);
  const key = (it) => JSON.stringify([it.type, it.id, it.call_id, it.name, it.arguments, it.input]);
  const streamed = done.map(key).join('\n'), finalItems = (final.output || []).map(key).join('\n');
  if (streamed !== finalItems) bad.push(`streamed items differ from the final output:\n  ${streamed}\n  vs\n  ${finalItems}`);
  const text = events.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join('');
  if (text !== answerOf(final).text) bad.push('text deltas differ from the final text');
  for (const e of events.filter((x) => x.type === 'response.function_call_arguments.done')) {
    const item = (final.output || []).find((it) => it.id === e.item_id);
    if (!item || item.arguments !== e.arguments) bad.push(`arguments of ${e.item_id} differ from the final call's`);
  }
  return bad;
}

// What a response says, ids aside: for comparing an answer with the fault-free one.
export function answerOf(r) {
  const out = { status: r.status, reason: r.incomplete_details?.reason ?? null, text: '', reasoning: '', calls: [] };
  for (const it of r.output || []) {
    if (it.type === 'message') out.text += (it.content || []).map((c) => c.text ?? '').join('');
    else if (it.type === 'reasoning') out.reasoning += [...(it.content || []), ...(it.summary || [])].map((c) => c.text ?? '').join('');
    else if (it.type === 'function_call') out.calls.push({ type: it.type, name: it.name, arguments: it.arguments });
    else if (it.type === 'custom_tool_call') out.calls.push({ type: it.type, name: it.name, input: it.input });
  }
  return out;
}

// A conversation: turns until `stop()`, each retried as Codex would, its result recorded.
export class Conversation {
  constructor(id, opts) {
    this.id = id;
    this.opts = opts;  // { OpenAI, model, kind: 'llama'|'tools', rng, baseURL, generation, idleMs, ... }
    this.history = [];
    this.turnsInHistory = 0;
  }

  #newUserTurn() {
    const o = this.opts;
    if (this.turnsInHistory >= o.turnsPerConversation) {
      this.history = [];
      this.turnsInHistory = 0;
    }
    const text = this.turnsInHistory === 0 ? longPrompt(o.rng, o.promptChars) : `Now step ${this.turnsInHistory}: go on.`;
    this.history.push({ type: 'message', role: 'user', content: [{ type: 'input_text', text }] });
    this.turnsInHistory += 1;
  }

  body() {
    const o = this.opts;
    return {
      model: o.model,
      instructions: 'You are a coding agent working in a repository.',
      input: structuredClone(this.history),
      tools: TOOLS,
      tool_choice: 'auto',
      parallel_tool_calls: true,
      // The llama model alternates the channel its answer comes in: thinking off (text), on (reasoning).
      reasoning: { effort: o.kind === 'llama' ? (this.turnsInHistory % 2 ? 'none' : 'high') : 'medium' },
      max_output_tokens: o.maxOutputTokens,
      store: false,
      temperature: 0,
    };
  }

  // One turn: a request (and its retries) until a terminal answer or the retry budget is spent.
  async turn(tally) {
    const o = this.opts;
    const last = this.history.at(-1);
    const answeringCalls = last && (last.type === 'function_call_output' || last.type === 'custom_tool_call_output');
    if (!answeringCalls) this.#newUserTurn();
    const t0 = Date.now();
    const record = { conversation: this.id, kind: o.kind, t0, t1: 0, attempts: 0, requests: 0, turn_retries: 0, outcome: 'lost',
      violations: [], errors: [], body: null, answer: null };
    for (let retry = 0; retry <= o.streamMaxRetries; retry++) {
      if (retry > 0) {
        record.turn_retries += 1;
        await new Promise((r) => setTimeout(r, Math.min(200 * 2 ** (retry - 1), 5000)));
      }
      const body = this.body();
      const a = await streamOnce(o.OpenAI, o, body, o.idleMs, tally);
      record.attempts += 1;
      record.requests += a.fetches.length;
      if (a.idle) record.violations.push(`idle timeout: no event for ${o.idleMs} ms (attempt ${retry + 1})`);
      // Codex keeps the items a failed stream finished.
      const finished = a.events.filter((e) => e.type === 'response.output_item.done').map((e) => e.item);
      const terminal = a.events.find((e) => ['response.completed', 'response.incomplete', 'response.failed'].includes(e.type));
      if (terminal && terminal.type !== 'response.failed') {
        for (const v of checkStream(a.events, body)) record.violations.push(v);
        record.outcome = 'completed';
        record.body = body;
        record.answer = terminal.response;
        this.#keep(terminal.response.output || []);
        break;
      }
      const code = terminal?.response?.error?.code;
      record.errors.push(terminal ? `response.failed ${code}: ${terminal.response.error?.message}` : `${a.error?.constructor?.name}: ${a.error?.message}`);
      if (terminal && IDLE_FATAL_CODES.has(code)) break;
      if (a.error && a.error.status && a.error.status >= 400 && a.error.status < 500 && a.error.status !== 404 && a.error.status !== 429) break;  // fatal for Codex
      // A failed stream's finished messages and reasoning stay; its calls are not run (no
      // response.completed), so they are not kept.
      this.#keep(finished.filter((it) => it.type === 'message' || it.type === 'reasoning'));
    }
    record.t1 = Date.now();
    return record;
  }

  // Output items into the history, and the tools' results for its calls (a reply to each).
  #keep(items) {
    for (const it of items) {
      if (!['message', 'reasoning', 'function_call', 'custom_tool_call'].includes(it.type)) continue;
      const { id, status, ...rest } = it;  // eslint-disable-line no-unused-vars
      this.history.push(rest);
    }
    for (const it of items) {
      if (it.type === 'function_call') this.history.push({ type: 'function_call_output', call_id: it.call_id, output: 'a.txt\nb.txt\n' });
      if (it.type === 'custom_tool_call') this.history.push({ type: 'custom_tool_call_output', call_id: it.call_id, output: 'Done.' });
    }
  }
}
