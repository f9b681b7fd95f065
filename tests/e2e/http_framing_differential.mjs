// Differential test of request framing: the same bytes go to Pulse and to Node's own HTTP
// server (llhttp, strict mode: the parser a Node front proxy uses), and the two verdicts are
// compared. Request smuggling needs two parsers that accept the same bytes and split them into
// requests differently; so wherever both accept, the sequence of requests they answer must be
// the same, and wherever llhttp refuses, Pulse must refuse too. Pulse may refuse more (a
// refusal closes the connection: nothing can be smuggled), but only in the cases listed in
// `stricter` below, each with its reason, so a change in either direction fails the test.
//
// usage: node http_framing_differential.mjs PULSE_PORT
import http from 'node:http';
import net from 'node:net';

const pulsePort = Number(process.argv[2]);

// Each case: the bytes of one or more requests. Every case ends with a pipelined GET, so a
// body read with the wrong length shows as a different sequence of answers.
const tail = 'GET /second HTTP/1.1\r\nHost: x\r\n\r\n';
const post = (headers, body = '') => `POST /probe HTTP/1.1\r\nHost: x\r\n${headers}\r\n${body}${tail}`;
const cases = {};
const add = (name, bytes) => { cases[name] = bytes; };

// Content-Length spellings.
for (const [name, v] of Object.entries({
  plain: '5', zeros: '005', plus: '+5', minus: '-5', trailing_space: '5 ', leading_space: ' 5', list_same: '5,5',
  list_space: '5, 5', hex: '0x5', decimal: '5.0', empty: '', letters: 'abc', huge: '99999999999999999999', tab: '\t5',
})) add(`cl_${name}`, post(`Content-Length: ${v}\r\n`, 'hello'));
add('cl_twice_same', post('Content-Length: 5\r\nContent-Length: 5\r\n', 'hello'));
add('cl_twice_0_then_5', post('Content-Length: 0\r\nContent-Length: 5\r\n', 'hello'));
add('cl_space_before_colon', post('Content-Length : 5\r\n', 'hello'));
add('cl_tab_before_colon', post('Content-Length\t: 5\r\n', 'hello'));
add('cl_name_case', post('content-LENGTH: 5\r\n', 'hello'));
add('cl_zero', post('Content-Length: 0\r\n'));
add('no_length_post', post(''));

// Transfer-Encoding spellings and combinations.
const chunked = '5\r\nhello\r\n0\r\n\r\n';
for (const [name, v] of Object.entries({
  chunked: 'chunked', upper: 'CHUNKED', trailing_space: 'chunked ', identity: 'identity', chunked_identity: 'chunked, identity',
  identity_chunked: 'identity, chunked', gzip_chunked: 'gzip, chunked', chunked_chunked: 'chunked, chunked', xchunked: 'xchunked',
  empty_element: ', chunked', vertical_tab: 'chunked\x0b',
})) add(`te_${name}`, post(`Transfer-Encoding: ${v}\r\n`, chunked));
add('te_two_lines_chunked_identity', post('Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n', chunked));
add('te_two_lines_identity_chunked', post('Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n', chunked));
add('te_space_before_colon', post('Transfer-Encoding : chunked\r\n', chunked));
add('te_and_cl', post('Transfer-Encoding: chunked\r\nContent-Length: 5\r\n', chunked));
add('te_in_http10', `POST /probe HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}`);

// Chunked bodies.
for (const [name, body] of Object.entries({
  extension: '5;name=value\r\nhello\r\n0\r\n\r\n', upper_hex: 'A\r\nhellohello\r\n0\r\n\r\n', leading_zeros: '005\r\nhello\r\n0\r\n\r\n',
  size_overflow: 'fffffffffffffffff5\r\nhello\r\n0\r\n\r\n', missing_data_crlf: '5\r\nhello0\r\n\r\n', trailer: '5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n',
  bare_lf_size: '5\nhello\r\n0\r\n\r\n', bare_lf_data: '5\r\nhello\n0\r\n\r\n', bare_lf_last: '5\r\nhello\r\n0\n\n', space_after_size: '5 \r\nhello\r\n0\r\n\r\n',
  plus_size: '+5\r\nhello\r\n0\r\n\r\n', negative_size: '-5\r\nhello\r\n0\r\n\r\n', empty_size: '\r\nhello\r\n0\r\n\r\n',
})) add(`chunk_${name}`, post('Transfer-Encoding: chunked\r\n', body));

// Line endings, folding and bytes inside a head.
add('bare_lf_head', 'GET /probe HTTP/1.1\nHost: x\n\n' + tail);
add('bare_cr_head', 'GET /probe HTTP/1.1\rHost: x\r\n\r\n' + tail);
add('obs_fold', post('X-Folded: a\r\n b\r\n'));
add('obs_fold_cl', post('X-A: a\r\n Content-Length: 5\r\n', 'hello'));
add('nul_in_value', post('X-Nul: a\0b\r\n'));
add('del_in_value', post('X-Del: a\x7fb\r\n'));
add('obs_text_in_value', post('X-Text: caf\xe9\r\n'));
add('ctl_in_target', 'GET /a\x01b HTTP/1.1\r\nHost: x\r\n\r\n' + tail);
add('space_in_target', 'GET /a b HTTP/1.1\r\nHost: x\r\n\r\n' + tail);
add('double_space_request_line', 'GET  /probe HTTP/1.1\r\nHost: x\r\n\r\n' + tail);
add('lower_version', 'GET /probe http/1.1\r\nHost: x\r\n\r\n' + tail);
add('http2_version', 'GET /probe HTTP/2.0\r\nHost: x\r\n\r\n' + tail);
add('bad_method', 'GE(T /probe HTTP/1.1\r\nHost: x\r\n\r\n' + tail);
add('no_colon', post('NoColonHere\r\n'));
add('empty_name', post(': value\r\n'));
add('leading_empty_line', '\r\nGET /probe HTTP/1.1\r\nHost: x\r\n\r\n' + tail);
add('no_host', 'GET /probe HTTP/1.1\r\n\r\n' + tail);
add('two_hosts', 'GET /probe HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n' + tail);
add('http10_no_host', 'GET /probe HTTP/1.0\r\n\r\n');
add('plain_get', 'GET /probe HTTP/1.1\r\nHost: x\r\n\r\n' + tail);

// Where Pulse refuses what llhttp accepts, and why that is on purpose. Both sides close the
// connection on a refusal, so none of these can desynchronise a proxy in front of Pulse.
const stricter = {
  te_identity_chunked: 'codings other than chunked are not implemented (501)',
  te_gzip_chunked: 'codings other than chunked are not implemented (501)',
  te_two_lines_identity_chunked: 'codings other than chunked are not implemented (501)',
  te_in_http10: 'RFC 9112 §6.1: Transfer-Encoding in an HTTP/1.0 message MUST be treated as faulty framing',
  two_hosts: 'RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1 request with more than one Host field',
  double_space_request_line: 'RFC 9112 §3: single SP between the request-line elements (whitespace-word parsing is only a MAY)',
};

// Sends `bytes` on a fresh connection, half-closes, and collects the status codes of the
// answers until the server closes (bounded: 3 s).
function statuses(port, bytes) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = Buffer.alloc(0);
    const done = () => {
      clearTimeout(timer);
      sock.destroy();
      const text = got.toString('latin1');
      resolve([...text.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1])));
    };
    const timer = setTimeout(done, 3000);
    sock.on('connect', () => sock.end(Buffer.from(bytes, 'latin1')));
    sock.on('data', (d) => { got = Buffer.concat([got, d]); });
    sock.on('close', done);
    sock.on('error', done);
  });
}

// A verdict: one letter per answer, A (the request was read and served) or R (refused as
// malformed: 400, 413, 431, 501, 505).
const refusal = new Set([400, 413, 431, 501, 505]);
const verdict = (codes) => codes.map((c) => (refusal.has(c) ? 'R' : 'A')).join('');

const server = http.createServer((req, res) => {
  req.resume();
  req.on('end', () => { res.writeHead(200, { 'Content-Length': '2' }); res.end('ok'); });
});
server.on('clientError', (err, socket) => {
  if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
  else socket.destroy();
});
await new Promise((r) => server.listen(0, '127.0.0.1', r));
const nodePort = server.address().port;

let failures = 0, agreed = 0, stricterSeen = 0;
const seenStricter = new Set();
for (const [name, bytes] of Object.entries(cases)) {
  const [p, n] = await Promise.all([statuses(pulsePort, bytes), statuses(nodePort, bytes)]);
  const vp = verdict(p), vn = verdict(n);
  if (vp === vn) { agreed++; continue; }
  // Pulse stricter: the same answers up to a point, then a refusal where llhttp served or said nothing.
  const k = vp.indexOf('R');
  const isStricter = k >= 0 && vp.length === k + 1 && vn.startsWith(vp.slice(0, k)) && vn[k] !== 'R';
  if (isStricter && stricter[name]) { stricterSeen++; seenStricter.add(name); continue; }
  failures++;
  console.log(`FAIL ${name}: pulse ${JSON.stringify(p)} (${vp || 'nothing'}), llhttp ${JSON.stringify(n)} (${vn || 'nothing'})` +
              (isStricter ? ' — Pulse refuses and llhttp serves: list it in `stricter` with its reason, or fix it' : ''));
}
// A listed case where the two now agree is stale: the list must say what is true.
for (const name of Object.keys(stricter)) {
  if (!seenStricter.has(name) && name in cases) {
    failures++;
    console.log(`FAIL ${name}: listed as Pulse-stricter, but the verdicts agree now: remove it from the list`);
  }
}
server.close();
console.log(`framing: ${Object.keys(cases).length} cases, ${agreed} agree, ${stricterSeen} where Pulse is stricter (listed)`);
console.log(failures ? `framing: ${failures} disagreements` : 'framing: no disagreement');
process.exit(failures ? 1 : 0);
