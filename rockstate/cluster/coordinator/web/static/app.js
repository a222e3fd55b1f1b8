// The status page: fetches /api/status every REFRESH ms and draws it; no libraries.
"use strict";
const REFRESH = 2000;
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

function partitionMap(s) {
  const ids = s.nodes.map((n) => n.node_id);
  const live = new Set(s.nodes.filter((n) => ["alive", "suspect", "leaving"].includes(n.status)).map((n) => n.node_id));
  const moving = new Map(s.moves.map((m) => [m.partition, m]));
  document.getElementById("legend").replaceChildren(...s.nodes.filter((n) => n.partitions).map((n) =>
    el("span", {}, el("i", { style: `background:${color(ids, n.node_id)}` }), `${n.node_id} (${n.partitions})`)));
  document.getElementById("partition-map").replaceChildren(...s.owners.map((owner, pid) => {
    const cls = ["cell", live.has(owner) ? "" : "unavailable", moving.has(pid) ? "moving" : ""].join(" ").trim();
    const title = `partition ${pid}: ${owner ?? "unassigned"}` + (live.has(owner) ? "" : " (no live owner)") +
      (moving.has(pid) ? ` — moving to ${moving.get(pid).target}` : "");
    return el("div", { class: cls, title, "data-partition": pid, "data-owner": owner ?? "", style: `background:${color(ids, owner)}` }, String(pid));
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
  document.getElementById("replicas").style.display = list.length ? "" : "none";
  rows("replicas", list, (r) => el("tr", { "data-partition": r.partition, class: short.includes(r) ? "short" : "" },
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

function sparkline(values) {
  const ns = "http://www.w3.org/2000/svg", W = 120, H = 20, max = Math.max(...values, 1e-3);
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H);
  const path = document.createElementNS(ns, "path");
  path.setAttribute("d", values.map((v, i) => `${i ? "L" : "M"}${(i * W) / Math.max(values.length - 1, 1)},${H - 1 - (v / max) * (H - 2)}`).join(""));
  path.setAttribute("fill", "none"); path.setAttribute("stroke", "#2d6cdf"); path.setAttribute("stroke-width", "1.5");
  svg.append(path);
  return svg;
}

function pipelines(s) {
  rows("pipelines", s.pipelines, (r) => {
    const last = (r.batches || []).at(-1) || {};
    return [r.query, String(r.last_batch ?? ""), String(last.rows_in ?? ""), String(last.rows_out ?? ""), seconds(last.seconds),
      seconds(last.checkpoint_seconds), clock(r.updated), el("td", {}, sparkline((r.batches || []).map((b) => b.seconds || 0)))];
  });
}

function events(s) {
  rows("events", s.events.slice(-30).reverse(), (e) => [clock(e.time), e.event,
    Object.entries(e).filter(([k]) => !["seq", "time", "event"].includes(k)).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ")]);
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
    summary(s); nodes(s); partitionMap(s); replicas(s); checkpoints(s); pipelines(s); events(s);
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.epoch = s.epoch;
  } catch (err) {
    document.getElementById("updated").textContent = `cannot reach the coordinator: ${err.message}`;
  }
  setTimeout(refresh, REFRESH);
}
refresh();
