// The status page: fetches /api/status, /api/load and /api/events every REFRESH ms and draws them; no libraries.
"use strict";
const REFRESH = 2000;
const EVENTS_SHOWN = 30;
const view = { allReplicas: false, hiddenTypes: new Set(), types: [], counts: {} };  // what the reader chose; kept across refreshes
const COLORS = ["#2d6cdf", "#16a085", "#8e44ad", "#d35400", "#2c3e50", "#c2185b", "#7cb342", "#00838f", "#6d4c41", "#5c6bc0"];
const color = (owners, id) => (id == null ? "#999" : COLORS[owners.indexOf(id) % COLORS.length]);

function size(n) {
  if (n == null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
}
const seconds = (s) => (s == null ? "" : s < 1 ? (s * 1000).toFixed(0) + " ms" : s.toFixed(2) + " s");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "");

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c == null ? "" : c);
  return e;
}
function rows(id, list, cells) {
  const body = document.querySelector(`#${id} tbody`);
  body.replaceChildren(...list.map((item) => {
    const tr = cells(item);
    return tr instanceof Element ? tr : el("tr", {}, ...tr.map((c) => (c instanceof Element ? c : el("td", {}, c))));
  }));
}

function summary(s) {
  const alive = s.nodes.filter((n) => n.status === "alive").length;
  const suspect = s.nodes.filter((n) => n.status === "suspect").length;
  const parts = [`${s.partitions} partitions`, `table epoch ${s.epoch}`, `${alive} of ${s.nodes.length} nodes alive`];
  if (suspect) parts.push(`${suspect} suspect (silent)`);
  const out = document.getElementById("summary");
  out.replaceChildren(parts.join(" · "));
  if (s.unavailable) out.append(" · ", el("span", { class: "warn", id: "unavailable" }, `${s.unavailable} partitions without a live owner`));
  if (s.checkpoints) out.append(` · latest checkpoint ${s.checkpoints.latest ?? "none yet"}`);
  const restart = Object.entries(s.restart || {}).sort();
  if (restart.length) out.append(" · ", el("span", { class: "warn", id: "restart" },
    `restart ${restart.map(([node, names]) => `${node} (${names.join(", ")})`).join("; ")}: settings a node takes when it registers, changed on the coordinator since`));
}

function nodes(s) {
  rows("nodes", s.nodes, (n) => {
    const f = n.figures || {};
    const tr = el("tr", { "data-node": n.node_id },
      el("td", {}, n.node_id), el("td", {}, n.address), el("td", {}, n.zone || "—"),
      el("td", { class: n.status }, n.status), el("td", { class: "partitions" }, String(n.partitions)),
      el("td", {}, f.rss_bytes ? size(f.rss_bytes) : ""),
      el("td", {}, f.rocksdb ? `${size(f.rocksdb.block_cache_bytes)} / ${size(f.memory_limit_bytes)}` : ""),
      el("td", {}, f.disk ? size(f.disk.used_bytes) : ""), el("td", {}, f.disk ? size(f.disk.free_bytes) : ""),
      el("td", {}, `${n.last_seen.toFixed(1)} s ago`));
    return tr;
  });
}

// An owner's colour, lighter the fewer bytes the partition holds than the largest one (alpha from 0.25 to 1).
function shade(hex, fraction) {
  const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  return `rgba(${r},${g},${b},${(0.25 + 0.75 * fraction).toFixed(2)})`;
}

function partitionMap(s) {
  const ids = s.nodes.map((n) => n.node_id);
  const sizes = s.sizes ? s.sizes.partitions : [];
  const largest = Math.max(1, ...sizes.map((p) => (p ? p.bytes : 0)));
  const live = new Set(s.nodes.filter((n) => ["alive", "suspect", "leaving"].includes(n.status)).map((n) => n.node_id));
  const moving = new Map(s.moves.map((m) => [m.partition, m]));
  document.getElementById("legend").replaceChildren(...s.nodes.filter((n) => n.partitions).map((n) =>
    el("span", {}, el("i", { style: `background:${color(ids, n.node_id)}` }), `${n.node_id} (${n.partitions})`)));
  document.getElementById("partition-map").replaceChildren(...s.owners.map((owner, pid) => {
    const held = sizes[pid];  // undefined: not counted yet; null: its owner did not answer
    const light = held && owner != null && held.bytes / largest < 0.5;  // a pale cell: dark figures on it
    const cls = ["cell", live.has(owner) ? "" : "unavailable", moving.has(pid) ? "moving" : "", light ? "light" : ""].join(" ").trim();
    const title = `partition ${pid}: ${owner ?? "unassigned"}` + (live.has(owner) ? "" : " (no live owner)") +
      (held ? ` — ${held.keys} keys, ${size(held.bytes)}` : "") + (moving.has(pid) ? ` — moving to ${moving.get(pid).target}` : "");
    const attrs = { class: cls, title, "data-partition": pid, "data-owner": owner ?? "" };
    if (held) Object.assign(attrs, { "data-keys": held.keys, "data-bytes": held.bytes });
    const fill = held && owner != null ? shade(color(ids, owner), held.bytes / largest) : color(ids, owner);
    return el("div", { ...attrs, style: `background:${fill}` }, String(pid));
  }));
  const lines = s.moves.map((m) => `partition ${m.partition}: ${m.source} → ${m.target}`);
  if (s.failovers.length) lines.push(`failover in progress for ${s.failovers.join(", ")}`);
  document.getElementById("moves").replaceChildren(lines.length ? `In flight: ${lines.join("; ")}` : "No moves or failovers in flight.");
}

// Each partition's primary and backups; a backup not in sync is marked, as `rockstate status` does.
function replicas(s) {
  const list = s.replicas || [];
  const short = list.filter((r) => r.waiting_for_election || r.backups.length < s.backup_count || r.backups.some((b) => !b.in_sync));
  const out = document.getElementById("replica-summary");
  if (!s.backup_count) out.replaceChildren("No backups: backup_count is 0 (a node death restores its partitions from the latest checkpoint).");
  else if (short.length) out.replaceChildren(`${s.backup_count} backup(s) per partition, ${s.replication} replication · `,
    el("span", { class: "warn" }, `${short.length} partitions short of in-sync backups`));
  else out.replaceChildren(`${s.backup_count} backup(s) per partition, ${s.replication} replication · every backup in sync`);
  const shown = view.allReplicas ? list : short;  // by default only the exceptions: short of in-sync backups
  const toggle = document.getElementById("replicas-all");
  toggle.checked = view.allReplicas;
  document.getElementById("replica-toggle").style.display = list.length ? "" : "none";
  document.getElementById("replica-count").textContent = `show all ${list.length} partitions (${short.length} short)`;
  document.getElementById("replicas").style.display = shown.length ? "" : "none";
  rows("replicas", shown, (r) => el("tr", { "data-partition": r.partition, class: short.includes(r) ? "short" : "" },
    el("td", {}, String(r.partition)),
    el("td", { class: "primary" }, r.primary ?? "—", r.waiting_for_election ? el("span", { class: "warn electing" }, " waiting for election") : ""),
    el("td", { class: "backups" }, ...(r.backups.length ? r.backups.flatMap((b, i) => [i ? ", " : "",
      el("span", { class: b.in_sync ? "backup in-sync" : "backup catching-up", "data-node": b.node },
        b.in_sync ? b.node : `${b.node} (catching up)`)]) : ["—"])),
    el("td", {}, String(r.epoch))));
}

// A chart of bars (durations, left axis) and a line (sizes, right axis), drawn in SVG by hand.
function chart(svg, points, label) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), pad = 36;
  const ns = "http://www.w3.org/2000/svg";
  const node = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text != null) e.textContent = text;
    return e;
  };
  svg.replaceChildren();
  if (!points.length) { svg.append(node("text", { x: pad, y: H / 2 }, `no ${label} yet`)); return; }
  const maxD = Math.max(...points.map((p) => p.duration || 0), 1e-3), maxS = Math.max(...points.map((p) => p.size || 0), 1);
  const step = (W - 2 * pad) / points.length, y = (v, max) => H - pad + 4 - (v / max) * (H - 2 * pad);
  svg.append(node("line", { x1: pad, y1: H - pad + 4, x2: W - pad, y2: H - pad + 4, stroke: "#ccc" }));
  svg.append(node("text", { x: 2, y: 12 }, seconds(maxD)), node("text", { x: W - 2, y: 12, "text-anchor": "end" }, size(maxS)));
  let line = "";
  points.forEach((p, i) => {
    const x = pad + i * step, top = y(p.duration || 0, maxD);
    svg.append(node("rect", { x: x + 2, y: top, width: Math.max(step - 4, 1), height: H - pad + 4 - top, fill: p.ok ? "#2d6cdf" : "#c0262d" },
      null));
    svg.lastChild.append(node("title", {}, `${p.label}: ${seconds(p.duration)}, ${size(p.size)}`));
    line += `${i ? "L" : "M"}${x + step / 2},${y(p.size || 0, maxS)}`;
    if (points.length <= 20 || i % Math.ceil(points.length / 20) === 0) svg.append(node("text", { x: x + 2, y: H - pad + 16 }, p.label));
  });
  svg.append(node("path", { d: line, fill: "none", stroke: "#d35400", "stroke-width": 2 }));
  svg.append(node("text", { x: pad, y: H - 4 }, `bars: duration · line: size`));
}

function checkpoints(s) {
  const c = s.checkpoints;
  document.getElementById("checkpoint-summary").replaceChildren(c ? `storage ${c.url}` : "No checkpoint storage configured.");
  document.getElementById("checkpoint-chart").style.display = c ? "" : "none";
  const history = c ? c.history : [];
  chart(document.getElementById("checkpoint-chart"), history.map((r) => ({
    label: String(r.checkpoint_id), duration: r.duration, size: r.size, ok: r.state !== "FAILED" && !r.failure })), "checkpoints");
  // a completed checkpoint that retention deleted is not there to restore any more (as `rockstate checkpoint list`)
  const state = (r) => (r.state === "COMPLETED" && r.retained === false ? "DELETED" : r.state);
  rows("checkpoints", history.slice().reverse(), (r) => [String(r.checkpoint_id), state(r), r.trigger, clock(r.started_at),
    seconds(r.duration), size(r.size), size(r.uploaded_bytes), r.failure || ""]);
}

// A line of values in SVG, scaled to its largest; `title` (with the largest) as its tooltip.
function sparkline(values, { title = "", stroke = "#2d6cdf", W = 120, H = 20 } = {}) {
  const ns = "http://www.w3.org/2000/svg", max = Math.max(...values, 1e-3);
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  svg.setAttribute("class", "sparkline"); svg.dataset.points = values.length; svg.dataset.max = Math.max(0, ...values);
  const drawn = values.length === 1 ? [values[0], values[0]] : values;  // one point: a flat line (a lone M draws nothing)
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", drawn.map((v, i) => `${i ? "L" : "M"}${(i * W) / Math.max(drawn.length - 1, 1)},${H - 1 - (v / max) * (H - 2)}`).join(""));
  path.setAttribute("fill", "none"); path.setAttribute("stroke", stroke); path.setAttribute("stroke-width", "1.5");
  svg.append(path);
  if (title) {
    const t = document.createElementNS(ns, "title");
    t.textContent = title;
    svg.append(t);
  }
  return svg;
}

// Each node's clients' requests over the last minutes (/api/load): the latest rates, and a line of each.
function load(l) {
  const perSecond = (v) => (v == null ? "" : v >= 100 ? v.toFixed(0) + "/s" : v.toFixed(1) + "/s");
  const span = `the last ${Math.round(l.window_seconds / 60)} min`;
  rows("load", Object.entries(l.nodes), ([node, points]) => {
    const last = points.at(-1) || {};
    const line = (key, what, stroke, show) => el("td", { class: key }, sparkline(points.map((p) => p[key] || 0),
      { stroke, title: `${what} over ${span}: at most ${show(Math.max(0, ...points.map((p) => p[key] || 0)))}` }));
    return el("tr", { "data-node": node }, el("td", {}, node),
      el("td", {}, perSecond(last.requests_per_s)), line("requests_per_s", "requests", "#2d6cdf", perSecond),
      el("td", {}, perSecond(last.keys_written_per_s)), line("keys_written_per_s", "keys written", "#16a085", perSecond),
      el("td", {}, perSecond(last.keys_read_per_s)), line("keys_read_per_s", "keys read", "#8e44ad", perSecond),
      el("td", {}, seconds(last.mean_latency_s)), el("td", {}, last.p99_latency_s == null ? "" : "≤ " + seconds(last.p99_latency_s)),
      line("mean_latency_s", "mean latency", "#d35400", seconds));
  });
  document.getElementById("load-summary").textContent = Object.keys(l.nodes).length ?
    `Clients' requests per node over ${span}, a point every ${l.sample_every_seconds} s (the nodes' own counters).` : "No figures yet.";
}

// The states and what they hold (rs.stats(), as `rockstate states` lists them), counted at most every few seconds.
function states(s) {
  const z = s.sizes;
  document.getElementById("state-summary").textContent = z ? `${z.states.length} states · counted ${z.age.toFixed(0)} s ago` :
    `${s.states} states · not counted yet`;
  rows("states", z ? z.states : [], (r) => el("tr", { "data-state": r.name }, el("td", {}, r.name), el("td", {}, r.kind),
    el("td", {}, r.ttl == null ? "—" : `${r.ttl} s`), el("td", { class: "keys" }, String(r.keys)),
    el("td", { class: "bytes", "data-bytes": r.bytes }, size(r.bytes)), el("td", {}, r.query || ""), el("td", {}, r.operator || "")));
}

function pipelines(s) {
  rows("pipelines", s.pipelines, (r) => {
    const last = (r.batches || []).at(-1) || {};
    return [r.query, String(r.last_batch ?? ""), String(last.rows_in ?? ""), String(last.rows_out ?? ""), seconds(last.seconds),
      seconds(last.checkpoint_seconds), clock(r.updated), el("td", {}, sparkline((r.batches || []).map((b) => b.seconds || 0)))];
  });
}

// The recent events of the types not unticked (/api/events?type=...), and a checkbox per type the log holds.
function eventsQuery() {
  const shown = view.types.filter((t) => !view.hiddenTypes.has(t));
  const types = view.hiddenTypes.size ? shown.map((t) => "&type=" + encodeURIComponent(t)).join("") : "";
  return view.hiddenTypes.size && !shown.length ? null : `api/events?limit=${EVENTS_SHOWN}${types}`;
}

function events(answer) {
  view.counts = answer.types;
  const box = document.getElementById("event-types");
  const types = Object.keys(answer.types);
  if (types.join() !== view.types.join()) {  // redrawn only when the types change: a click is not lost
    view.types = types;
    box.replaceChildren(...types.map((t) => {
      const input = el("input", { type: "checkbox", "data-type": t });
      input.checked = !view.hiddenTypes.has(t);
      input.addEventListener("change", () => {
        if (input.checked) view.hiddenTypes.delete(t); else view.hiddenTypes.add(t);
        drawEvents();
      });
      return el("label", { "data-type": t }, input, " ", t, el("span", { class: "count" }, ""));
    }));
  }
  for (const label of box.children) label.querySelector(".count").textContent = ` (${answer.types[label.dataset.type]})`;
  rows("events", answer.events.slice().reverse(), (e) => el("tr", { "data-event": e.event }, ...[clock(e.time), e.event,
    Object.entries(e).filter(([k]) => !["seq", "time", "event"].includes(k)).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ")]
    .map((c) => el("td", {}, c))));
}

async function drawEvents() {
  const query = eventsQuery();
  if (query == null) return events({ types: view.counts, events: [] });  // every type unticked
  const response = await fetch(query, { cache: "no-store" });
  if (response.ok) events(await response.json());
}

async function refresh() {
  try {
    const response = await fetch("api/status", { cache: "no-store" });
    if (response.status === 503) {  // a standby coordinator: the cluster's state is the leader's
      const c = (await response.json()).coordinators || {};
      document.getElementById("updated").textContent =
        `this coordinator stands by; the leader is ${c.leader || "not elected yet"} (its own status page shows the cluster)`;
      setTimeout(refresh, REFRESH);
      return;
    }
    if (!response.ok) throw new Error(`${response.status} ${await response.text()}`);
    const s = await response.json();
    refresh.last = s;
    summary(s); nodes(s); states(s); partitionMap(s); replicas(s); checkpoints(s); pipelines(s);
    const answer = await fetch("api/load", { cache: "no-store" });
    if (answer.ok) load(await answer.json());
    await drawEvents();
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.epoch = s.epoch;
  } catch (err) {
    document.getElementById("updated").textContent = `cannot reach the coordinator: ${err.message}`;
  }
  setTimeout(refresh, REFRESH);
}
document.getElementById("replicas-all").addEventListener("change", (e) => {
  view.allReplicas = e.target.checked;
  if (refresh.last) replicas(refresh.last);
});
refresh();
