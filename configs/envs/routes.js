#!/usr/bin/env node
// routes: a route planner for a city's road network, on Debian's Node.js.
//
// At boot it builds the road network of a synthetic city (a jittered grid
// of --grid x --grid junctions, 100 m apart; some streets missing; every
// tenth street an arterial at 60 km/h, the others at 30 km/h; weights are
// travel times), then precomputes the ALT index that makes its queries
// fast: --landmarks landmarks picked one after another as the junction
// farthest from those already picked, each with a Dijkstra over the whole
// network whose travel times it keeps (A*, Landmarks and the Triangle
// inequality; Goldberg and Harrelson, 2005). That is seconds of CPU in
// V8's JIT (1-2 s for the defaults; the catalog's routes and fleet apps
// ask for 7 s and 22 s of it), and the index lives only in the process's
// memory. Only then does it listen, so its
// readiness probe (GET /healthz) passes once the index is built; a restored
// instance answers at once, with the index (and the build time it reports)
// of the instance that was checkpointed. With --hubs, a fleet's depots, it
// also computes the travel-time matrix between every two of them (one more
// Dijkstra per hub), what a vehicle-routing planner starts from.
//
//   routes [--port 8080] [--grid 500] [--landmarks 16] [--hubs 0] [--seed 1]
//
// HTTP API (JSON); every connection is closed once answered, so that a
// checkpoint never finds a half-closed connection:
//   GET /healthz                 {"status":"ok","built_at":...,"build_seconds":...,"junctions":...}
//   GET /route?from=ID&to=ID     fastest route: travel seconds, metres, hops,
//                                and how many junctions A* settled
//   GET /nearest?x=M&y=M         the junction nearest to a point (metres)
//   GET /matrix?from=I&to=J      travel seconds between hubs I and J (with --hubs)
//   GET /instance                this process's identity (/run/fogdeploy/identity.json
//                                when the platform wrote one) and a token drawn now from
//                                its own generator, seeded at boot
//   POST /reseed                 seeds that generator again from the kernel: what
//                                the app's post_restore asks each restored instance
//                                to do, so that instances restored from one
//                                checkpoint stop drawing the same tokens
'use strict';

const http = require('http');
const fs = require('fs');
const crypto = require('crypto');

function parseArgs(argv) {
  const opts = { port: 8080, grid: 500, landmarks: 16, hubs: 0, seed: 1 };
  for (let i = 0; i < argv.length; i++) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in opts) || i + 1 >= argv.length) {
      console.error(`routes: unknown or incomplete flag ${argv[i]}; flags: --port, --grid, --landmarks, --hubs, --seed`);
      process.exit(2);
    }
    const v = Number(argv[++i]);
    if (!Number.isInteger(v) || v < (name === 'hubs' ? 0 : 1)) {
      console.error(`routes: --${name} ${argv[i]}: want a ${name === 'hubs' ? 'non-negative' : 'positive'} integer`);
      process.exit(2);
    }
    opts[name] = v;
  }
  if (opts.grid < 2 || opts.grid > 3000) {
    console.error(`routes: --grid ${opts.grid}: want 2 to 3000`);
    process.exit(2);
  }
  if (opts.landmarks > 64) {
    console.error(`routes: --landmarks ${opts.landmarks}: want 1 to 64`);
    process.exit(2);
  }
  if (opts.hubs > 2000) {
    console.error(`routes: --hubs ${opts.hubs}: want 0 to 2000`);
    process.exit(2);
  }
  return opts;
}

// mulberry32: a small seeded generator, so that every boot builds the same city.
function prng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// The city: junctions on a jittered grid and two-way streets between
// neighbours, as a compressed adjacency (CSR) of travel times in seconds.
function buildCity(n, seed) {
  const rnd = prng(seed);
  const count = n * n;
  const x = new Float64Array(count);
  const y = new Float64Array(count);
  for (let r = 0; r < n; r++) {
    for (let c = 0; c < n; c++) {
      x[r * n + c] = c * 100 + (rnd() - 0.5) * 40;
      y[r * n + c] = r * 100 + (rnd() - 0.5) * 40;
    }
  }
  // Directed edges, two per street, in typed arrays sized for a full grid.
  const max = 4 * n * (n - 1);
  const from = new Int32Array(max);
  const to = new Int32Array(max);
  const secs = new Float64Array(max);
  const metres = new Float64Array(max);
  let m = 0;
  const street = (a, b, arterial) => {
    const d = Math.hypot(x[a] - x[b], y[a] - y[b]);
    const t = d / (arterial ? 60 / 3.6 : 30 / 3.6) + (arterial ? 2 : 6) * rnd(); // plus the wait at the junction
    from[m] = a;
    to[m] = b;
    secs[m] = t;
    metres[m++] = d;
    from[m] = b;
    to[m] = a;
    secs[m] = t;
    metres[m++] = d;
  };
  for (let r = 0; r < n; r++) {
    for (let c = 0; c < n; c++) {
      const v = r * n + c;
      // Arterials never miss a block; other streets do, one in twelve.
      if (c + 1 < n && (r % 10 === 0 || rnd() > 1 / 12)) street(v, v + 1, r % 10 === 0);
      if (r + 1 < n && (c % 10 === 0 || rnd() > 1 / 12)) street(v, v + n, c % 10 === 0);
    }
  }
  const start = new Int32Array(count + 1);
  for (let i = 0; i < m; i++) start[from[i] + 1]++;
  for (let v = 0; v < count; v++) start[v + 1] += start[v];
  const head = new Int32Array(m);
  const weight = new Float64Array(m);
  const length = new Float32Array(m);
  const fill = start.slice(0, count);
  for (let i = 0; i < m; i++) {
    const k = fill[from[i]]++;
    head[k] = to[i];
    weight[k] = secs[i];
    length[k] = metres[i];
  }
  return { n, count, x, y, start, head, weight, length, streets: m / 2 };
}

// A binary min-heap of (key, junction) pairs with lazy deletion.
class Heap {
  constructor(capacity) {
    this.keys = new Float64Array(capacity);
    this.vals = new Int32Array(capacity);
    this.size = 0;
  }
  push(k, v) {
    if (this.size === this.keys.length) this.grow();
    let i = this.size++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (this.keys[p] <= k) break;
      this.keys[i] = this.keys[p];
      this.vals[i] = this.vals[p];
      i = p;
    }
    this.keys[i] = k;
    this.vals[i] = v;
  }
  pop() {
    const top = this.vals[0];
    const k = this.keys[--this.size];
    const v = this.vals[this.size];
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= this.size) break;
      if (c + 1 < this.size && this.keys[c + 1] < this.keys[c]) c++;
      if (this.keys[c] >= k) break;
      this.keys[i] = this.keys[c];
      this.vals[i] = this.vals[c];
      i = c;
    }
    this.keys[i] = k;
    this.vals[i] = v;
    return top;
  }
  grow() {
    const keys = new Float64Array(this.keys.length * 2);
    const vals = new Int32Array(this.vals.length * 2);
    keys.set(this.keys);
    vals.set(this.vals);
    this.keys = keys;
    this.vals = vals;
  }
}

// Travel times from src to every junction (the network is two-way), into
// dist (reused from one call to the next).
function dijkstra(g, src, dist) {
  dist.fill(Infinity);
  const heap = new Heap(1 << 16);
  dist[src] = 0;
  heap.push(0, src);
  while (heap.size > 0) {
    const k = heap.keys[0];
    const v = heap.pop();
    if (k > dist[v]) continue;
    for (let e = g.start[v]; e < g.start[v + 1]; e++) {
      const w = g.head[e];
      const d = k + g.weight[e];
      if (d < dist[w]) {
        dist[w] = d;
        heap.push(d, w);
      }
    }
  }
  return dist;
}

// The ALT index: landmarks picked farthest-first, each with its travel times.
function buildLandmarks(g, k) {
  const marks = [];
  const tables = [];
  const nearest = new Float64Array(g.count).fill(Infinity);
  const dist = new Float64Array(g.count);
  let next = 0; // the first from a corner's Dijkstra, as usual
  dijkstra(g, 0, dist);
  for (let v = 0; v < g.count; v++) if (dist[v] !== Infinity && dist[v] > dist[next]) next = v;
  for (let i = 0; i < k; i++) {
    dijkstra(g, next, dist);
    const table = new Float32Array(g.count);
    let far = next;
    for (let v = 0; v < g.count; v++) {
      table[v] = dist[v];
      if (dist[v] < nearest[v]) nearest[v] = dist[v];
      if (nearest[v] !== Infinity && nearest[v] > nearest[far]) far = v;
    }
    marks.push(next);
    tables.push(table);
    next = far;
  }
  return { marks, tables };
}

// The hubs: junctions drawn at random, and the travel seconds between every
// two of them, a row-major matrix.
function buildMatrix(g, count, seed) {
  const rnd = prng(seed ^ 0x5eed);
  const hubs = new Int32Array(count);
  for (let i = 0; i < count; i++) hubs[i] = Math.floor(rnd() * g.count);
  const matrix = new Float32Array(count * count);
  const dist = new Float64Array(g.count);
  for (let i = 0; i < count; i++) {
    dijkstra(g, hubs[i], dist);
    for (let j = 0; j < count; j++) matrix[i * count + j] = dist[hubs[j]];
  }
  return { hubs, matrix };
}

function route(g, lm, s, t) {
  const h = (v) => {
    let best = 0;
    for (const tab of lm.tables) {
      const d = tab[t] - tab[v];
      const a = d < 0 ? -d : d;
      if (a > best && a !== Infinity) best = a;
    }
    return best * 0.999; // float32 tables: keep the bound admissible
  };
  const dist = new Map([[s, 0]]);
  const prev = new Map();
  const done = new Set();
  const heap = new Heap(1024);
  heap.push(h(s), s);
  while (heap.size > 0) {
    const v = heap.pop();
    if (done.has(v)) continue;
    done.add(v);
    if (v === t) break;
    const dv = dist.get(v);
    for (let e = g.start[v]; e < g.start[v + 1]; e++) {
      const w = g.head[e];
      const d = dv + g.weight[e];
      const old = dist.get(w);
      if (old === undefined || d < old) {
        dist.set(w, d);
        prev.set(w, e);
        heap.push(d + h(w), w);
      }
    }
  }
  if (!done.has(t)) return null;
  let hops = 0;
  let metres = 0;
  for (let v = t; v !== s; ) {
    const e = prev.get(v);
    metres += g.length[e];
    hops++;
    // The edge's tail: the junction whose adjacency holds e.
    let lo = 0;
    let hi = g.count - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (g.start[mid] <= e) lo = mid;
      else hi = mid - 1;
    }
    v = lo;
  }
  return { seconds: +dist.get(t).toFixed(1), metres: Math.round(metres), hops, settled: done.size };
}

// The token generator: SHA-256 over a seed and a counter. Its state lives
// in memory, so every instance restored from one checkpoint draws the same
// tokens until it is reseeded.
function kernelEntropy() {
  const fd = fs.openSync('/dev/urandom', 'r');
  try {
    const b = Buffer.alloc(32);
    fs.readSync(fd, b, 0, 32, null);
    return b;
  } finally {
    fs.closeSync(fd);
  }
}

function main() {
  const opts = parseArgs(process.argv.slice(2));
  let seed = kernelEntropy();
  let drawn = 0;
  let reseeded = null;
  const token = () => crypto.createHash('sha256').update(seed).update(String(drawn++)).digest('hex').slice(0, 16);
  const t0 = process.hrtime.bigint();
  const g = buildCity(opts.grid, opts.seed);
  const lm = buildLandmarks(g, opts.landmarks);
  const fleet = buildMatrix(g, opts.hubs, opts.seed);
  const buildSeconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const info = {
    status: 'ok',
    built_at: new Date().toISOString(),
    build_seconds: +buildSeconds.toFixed(2),
    junctions: g.count,
    streets: g.streets,
    landmarks: lm.marks.length,
    hubs: opts.hubs,
    seed: opts.seed,
  };
  console.log(`routes: ${g.count} junctions, ${g.streets} streets, ${lm.marks.length} landmarks, ${opts.hubs} hubs built in ${info.build_seconds} s; listening on ${opts.port}`);

  const send = (res, code, body) => {
    res.writeHead(code, { 'Content-Type': 'application/json', Connection: 'close' });
    res.end(JSON.stringify(body) + '\n');
  };
  const junction = (q, name) => {
    const v = Number(q.get(name));
    return Number.isInteger(v) && v >= 0 && v < g.count ? v : -1;
  };
  const server = http.createServer((req, res) => {
    const u = new URL(req.url, 'http://routes');
    const q = u.searchParams;
    switch (u.pathname) {
      case '/healthz':
        return send(res, 200, info);
      case '/route': {
        const s = junction(q, 'from');
        const t = junction(q, 'to');
        if (s < 0 || t < 0) return send(res, 400, { error: `from and to: junction numbers from 0 to ${g.count - 1}` });
        const r = route(g, lm, s, t);
        return r ? send(res, 200, { from: s, to: t, ...r }) : send(res, 404, { error: `no route from ${s} to ${t}` });
      }
      case '/matrix': {
        const i = Number(q.get('from'));
        const j = Number(q.get('to'));
        const ok = (h) => Number.isInteger(h) && h >= 0 && h < opts.hubs;
        if (!ok(i) || !ok(j)) return send(res, 400, { error: opts.hubs ? `from and to: hub numbers from 0 to ${opts.hubs - 1}` : 'no hubs: start with --hubs N' });
        const sec = fleet.matrix[i * opts.hubs + j];
        return send(res, 200, { from: i, to: j, from_junction: fleet.hubs[i], to_junction: fleet.hubs[j], seconds: sec === Infinity ? null : +sec.toFixed(1) });
      }
      case '/nearest': {
        const px = Number(q.get('x'));
        const py = Number(q.get('y'));
        if (!Number.isFinite(px) || !Number.isFinite(py)) return send(res, 400, { error: 'x and y: metres, as numbers' });
        const c = Math.min(g.n - 1, Math.max(0, Math.round(px / 100)));
        const r = Math.min(g.n - 1, Math.max(0, Math.round(py / 100)));
        let best = r * g.n + c;
        for (let dr = -1; dr <= 1; dr++) {
          for (let dc = -1; dc <= 1; dc++) {
            const rr = r + dr;
            const cc = c + dc;
            if (rr < 0 || cc < 0 || rr >= g.n || cc >= g.n) continue;
            const v = rr * g.n + cc;
            if (Math.hypot(g.x[v] - px, g.y[v] - py) < Math.hypot(g.x[best] - px, g.y[best] - py)) best = v;
          }
        }
        return send(res, 200, { junction: best, x: +g.x[best].toFixed(1), y: +g.y[best].toFixed(1) });
      }
      case '/instance': {
        let identity = null;
        try {
          identity = JSON.parse(fs.readFileSync(process.env.FOGDEPLOY_IDENTITY || '/run/fogdeploy/identity.json', 'utf8'));
        } catch {
          // not run by fogdeploy
        }
        return send(res, 200, { pid: process.pid, identity, reseeded_at: reseeded, token: token() });
      }
      case '/reseed':
        if (req.method !== 'POST') return send(res, 405, { error: 'POST /reseed' });
        seed = kernelEntropy();
        drawn = 0;
        reseeded = new Date().toISOString();
        return send(res, 200, { reseeded_at: reseeded });
      default:
        return send(res, 404, { error: 'try /healthz, /route?from=&to=, /nearest?x=&y=, /matrix?from=&to=, /instance or POST /reseed' });
    }
  });
  server.keepAliveTimeout = 0;
  server.listen(opts.port, '0.0.0.0');
  const stop = () => server.close(() => process.exit(0));
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

main();
