// What a chaos run reports: a table on standard output, report.json, and a chart (turns and
// faults over time, SVG through gnuplot) in the output directory.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';

const pct = (xs, p) => {
  if (!xs.length) return null;
  const s = [...xs].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))];
};

export function report(r) {
  const turns = r.turns;
  const completed = turns.filter((t) => t.outcome === 'completed');
  const lost = turns.filter((t) => t.outcome !== 'completed');
  const retried = completed.filter((t) => t.turn_retries > 0 || t.requests > t.attempts);
  const compared = turns.filter((t) => t.compared);
  const equal = compared.filter((t) => t.equal);
  const lat = (ts) => ts.map((t) => t.t1 - t.t0);
  const hit = completed.filter((t) => t.metFault), calm = completed.filter((t) => !t.metFault);
  const byKind = {};
  for (const k of r.kinds) byKind[k] = 0;
  for (const f of r.faults) byKind[f.kind] = (byKind[f.kind] || 0) + 1;
  const turnViolations = turns.flatMap((t) => t.violations.map((v) => `conversation ${t.conversation} (${t.kind}) at ${((t.t0 - r.stormStart) / 1000).toFixed(1)} s: ${v}`));
  const missingKinds = r.kinds.filter((k) => byKind[k] === 0);
  const summary = {
    seed: r.seed, duration_s: r.duration, conversations: r.conversations,
    faults: { total: r.faults.length, by_kind: byKind },
    turns: { total: turns.length, completed: completed.length, needed_client_retry: retried.length, lost: lost.length,
      met_fault: hit.length },
    comparisons: { compared: compared.length, equal: equal.length, of_turns_that_met_a_fault: compared.filter((t) => t.metFault).length },
    latency_ms: { met_fault: { p50: pct(lat(hit), 50), p99: pct(lat(hit), 99) }, no_fault: { p50: pct(lat(calm), 50), p99: pct(lat(calm), 99) } },
    counters: r.counters, footprint: r.footprint, limits: r.limits,
    violations: [...r.violations, ...turnViolations], lost_turns: lost.map((t) => ({ conversation: t.conversation, kind: t.kind, errors: t.errors })),
    kinds_not_injected: missingKinds, notes: r.notes,
  };
  summary.ok = lost.length === 0 && summary.violations.length === 0 && compared.length === equal.length;
  fs.writeFileSync(`${r.out}/report.json`, JSON.stringify({ ...summary, faults_log: r.faults,
    turns_log: turns.map(({ body, answer, ...t }) => t) }, null, 1));  // eslint-disable-line no-unused-vars

  const row = (k, v) => console.log(`  ${k.padEnd(44)} ${v}`);
  console.log(`\nchaos run, seed ${r.seed}, ${r.duration} s, ${r.conversations} conversations`);
  row('faults injected', r.faults.length);
  for (const [k, n] of Object.entries(byKind)) row(`  ${k}`, n);
  row('turns', turns.length);
  row('turns completed', completed.length);
  row('turns that needed a client retry', retried.length);
  row('lost turns', lost.length);
  row('turns that met a fault', hit.length);
  row('answers compared with the fault-free one', `${compared.length} (${equal.length} equal)`);
  row('turn latency p50/p99, met a fault (ms)', `${summary.latency_ms.met_fault.p50} / ${summary.latency_ms.met_fault.p99}`);
  row('turn latency p50/p99, no fault (ms)', `${summary.latency_ms.no_fault.p50} / ${summary.latency_ms.no_fault.p99}`);
  row('gateway counters (last generation)', JSON.stringify(r.counters.gateway));
  row('clients\' tally (same generation)', JSON.stringify(r.counters.clients));
  row('  sent while it was starting', JSON.stringify(r.counters.sent_while_it_started));
  row('failovers, resumes (whole run)', `${r.counters.run_totals.failovers}, ${r.counters.run_totals.resumes}`);
  row('footprint before -> after', `${JSON.stringify(r.footprint.baseline)} -> ${JSON.stringify(r.footprint.after)}`);
  if (missingKinds.length) row('fault kinds not injected', missingKinds.join(', '));
  for (const n of r.notes) console.log(`  note: ${n}`);
  for (const v of summary.violations) console.log(`  VIOLATION: ${v}`);
  for (const t of summary.lost_turns) console.log(`  LOST: conversation ${t.conversation} (${t.kind}): ${t.errors.join(' | ')}`);
  console.log(summary.ok ? 'chaos: every invariant held, no turn lost' : 'chaos: FAILED');
  chart(r);
  return summary;
}

// Turns completed per 10 s and faults (one row per kind) over the storm.
function chart(r) {
  const bucket = 10000;
  const n = Math.max(1, Math.ceil((r.stormEnd - r.stormStart) / bucket));
  const counts = new Array(n).fill(0);
  for (const t of r.turns) if (t.outcome === 'completed') counts[Math.min(n - 1, Math.max(0, Math.floor((t.t1 - r.stormStart) / bucket)))]++;
  fs.writeFileSync(`${r.out}/turns.dat`, counts.map((c, i) => `${i * 10 + 5} ${c}`).join('\n') + '\n');
  fs.writeFileSync(`${r.out}/faults.dat`, r.faults.map((f) => `${((f.t0 - r.stormStart) / 1000).toFixed(1)} ${r.kinds.indexOf(f.kind) + 1} ${Math.max(0.5, ((f.t1 || f.t0) - f.t0) / 1000).toFixed(1)}`).join('\n') + '\n');
  const plot = `set terminal svg size 1000,600
set output "${r.out}/chaos.svg"
set multiplot layout 2,1 title "chaos run, seed ${r.seed}"
set ylabel "turns completed / 10 s"
set xrange [0:${n * 10}]
plot "${r.out}/turns.dat" using 1:2 with boxes fill solid 0.5 title "turns"
set ylabel "fault"
set ytics (${r.kinds.map((k, i) => `"${k}" ${i + 1}`).join(', ')})
set yrange [0:${r.kinds.length + 1}]
set xlabel "seconds into the storm"
plot "${r.out}/faults.dat" using 1:2:3:(0) with vectors nohead lw 4 title "faults (length: how long)"
unset multiplot
`;
  fs.writeFileSync(`${r.out}/chaos.gp`, plot);
  try {
    execFileSync('gnuplot', [`${r.out}/chaos.gp`], { stdio: 'ignore' });
  } catch {
    console.log(`  (no chart: gnuplot did not run; ${r.out}/chaos.gp has the plot)`);
  }
}
