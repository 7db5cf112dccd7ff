// waferrt serve's live page. Reads GET /v1/wafer/state (JSON, waferrt.server.state) and follows
// GET /v1/wafer/events (SSE: the same state every half second, read with fetch so that the key can go along): an event that carries the state is drawn at once,
// any other makes the page read the state again. While the event stream is down the page polls the state every
// second. What it draws: the mesh (SRAM per core, modelled link bytes per core, busy per tile, dead and spare
// cores), the requests in flight, the recent requests' mean wall and modelled TTFT and ITL (TPOT: a request's
// mean gap), the faults as they are injected, fire, are detected and recovered. Plain JavaScript, no build step.
"use strict";

const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function colour(v) {  // 0..1 -> a viridis-like rgb()
  v = Math.min(1, Math.max(0, Number.isFinite(v) ? v : 0)) * (VIRIDIS.length - 1);
  const i = Math.min(VIRIDIS.length - 2, Math.floor(v)), f = v - i, a = VIRIDIS[i], b = VIRIDIS[i + 1];
  return `rgb(${a.map((c, k) => Math.round(c + f * (b[k] - c))).join(",")})`;
}

function grid2d(rows) { return Array.isArray(rows) && rows.length && Array.isArray(rows[0]) ? rows : null; }

// a heatmap of `rows` (rows[y][x]) scaled by `top`, each cell `cell` px; marks: [[x, y, "dead"|"spare"]]
function heatmap(canvas, rows, top, marks, tiles) {
  const h = rows ? rows.length : 1, w = rows ? rows[0].length : 1;
  const cell = Math.max(2, Math.floor(360 / Math.max(w, h)));
  canvas.width = w * cell; canvas.height = h * cell;
  const g = canvas.getContext("2d");
  g.fillStyle = "#000"; g.fillRect(0, 0, canvas.width, canvas.height);
  if (!rows) return;
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) {
    g.fillStyle = colour(top > 0 ? rows[y][x] / top : 0);
    g.fillRect(x * cell, y * cell, cell, cell);
  }
  if (tiles && tiles.w > 0 && tiles.h > 0) {  // tile borders
    g.strokeStyle = "rgba(255,255,255,0.35)"; g.lineWidth = 1;
    for (let x = tiles.w; x < w; x += tiles.w) { g.beginPath(); g.moveTo(x * cell, 0); g.lineTo(x * cell, h * cell); g.stroke(); }
    for (let y = tiles.h; y < h; y += tiles.h) { g.beginPath(); g.moveTo(0, y * cell); g.lineTo(w * cell, y * cell); g.stroke(); }
  }
  for (const [x, y, kind] of marks || []) {
    g.lineWidth = Math.max(1, cell / 6);
    if (kind === "dead") {
      g.strokeStyle = "#ff3030"; g.beginPath();
      g.moveTo(x * cell, y * cell); g.lineTo((x + 1) * cell, (y + 1) * cell);
      g.moveTo((x + 1) * cell, y * cell); g.lineTo(x * cell, (y + 1) * cell); g.stroke();
    } else {
      g.strokeStyle = "#40d040"; g.strokeRect(x * cell + 1, y * cell + 1, cell - 2, cell - 2);
    }
  }
}

function perCore(tileRows, mesh, tiles) {  // a per-tile grid drawn over the cores it covers (the panels line up)
  if (!tileRows || !(tiles.w > 0 && tiles.h > 0)) return tileRows;
  return Array.from({ length: mesh.height }, (_, y) => Array.from({ length: mesh.width },
    (_, x) => (tileRows[Math.floor(y / tiles.h)] || [])[Math.floor(x / tiles.w)] ?? 0));
}

function maxOf(rows) { return rows ? Math.max(0, ...rows.map(r => Math.max(...r.map(Number)))) : 0; }

function where(f) { return Array.isArray(f.where) ? `core (${f.where.join(", ")})` : String(f.where ?? ""); }

function fmt(v, d = 1) { return Number.isFinite(v) ? v.toFixed(d) : "-"; }

function cell(text, cls) { const td = document.createElement("td"); td.textContent = text; if (cls) td.className = cls; return td; }

function tileGrid(busy, mesh, tiles) {  // {"tx,ty": share} (or rows already) -> rows[ty][tx]
  if (!busy || Array.isArray(busy)) return grid2d(busy);
  const rows = Array.from({ length: Math.ceil(mesh.height / tiles.h) },
    () => new Array(Math.ceil(mesh.width / tiles.w)).fill(0));
  for (const [key, v] of Object.entries(busy)) {
    const [tx, ty] = key.split(",").map(Number);
    if (rows[ty] && tx < rows[ty].length) rows[ty][tx] = v;
  }
  return rows;
}

let lastLinks = null;  // the state's links are of the tokens since the last look: kept while none ran
function drawMesh(mesh) {
  if (!mesh) return;
  const marks = [...(mesh.dead || []).map(([x, y]) => [x, y, "dead"]), ...(mesh.spare || []).map(([x, y]) => [x, y, "spare"])];
  const tiles = Array.isArray(mesh.tile) ? { w: mesh.tile[0], h: mesh.tile[1] } : { w: mesh.tile_w, h: mesh.tile_h };
  lastLinks = grid2d(mesh.links) || lastLinks;
  const links = lastLinks, linkTop = maxOf(links);
  heatmap(document.getElementById("sram"), grid2d(mesh.sram), 1, marks, tiles);
  heatmap(document.getElementById("links"), links, linkTop, marks, tiles);
  heatmap(document.getElementById("busy"), perCore(tileGrid(mesh.busy, mesh, tiles), mesh, tiles), 1, marks, tiles);
  document.getElementById("linkmax").textContent = linkTop ? `${Math.round(linkTop).toLocaleString()} B` : "max";
  document.getElementById("meshinfo").textContent =
    `${mesh.width}x${mesh.height} cores in tiles of ${tiles.w}x${tiles.h}`;
}

function drawRequests(requests) {
  const body = document.querySelector("#requests tbody");
  body.replaceChildren(...(requests || []).map(r => {
    const tr = document.createElement("tr");
    tr.dataset.testid = "request"; tr.dataset.state = r.state || "";
    const bar = document.createElement("div"); bar.className = "bar";
    bar.style.width = `${Math.min(100, 100 * (r.tokens || 0) / Math.max(1, r.max_tokens || r.tokens || 1))}%`;
    const td = document.createElement("td"); td.append(bar);
    tr.append(cell(String(r.id)), cell(r.state || ""), cell(String(r.prompt_tokens ?? ""), "num"),
              cell(`${r.tokens ?? 0}${r.max_tokens ? " / " + r.max_tokens : ""}`, "num"), td);
    return tr;
  }));
}

function faultState(f) {  // the fault log's outcome (waferrt.faults.events) as one word
  if (f.state) return f.state;
  const o = f.outcome || "";
  return o === "recovered" ? "recovered" : o.startsWith("detected") ? "detected"
    : o.startsWith("fired") ? "injected" : o === "did not fire" ? "armed" : o;
}

function drawFaults(faults) {
  const body = document.querySelector("#faults tbody");
  body.replaceChildren(...(faults || []).map(f => {
    const tr = document.createElement("tr"), state = faultState(f);
    const took = f.recovery_s ?? f.recovered_after_s;
    tr.dataset.testid = "fault"; tr.dataset.state = state;
    tr.append(cell(String(f.id ?? f.index ?? "")), cell(f.kind || ""), cell(where(f)), cell(state, state),
              cell(Number.isFinite(took) ? `${took.toFixed(2)} s` : "", "num"));
    return tr;
  }));
}

function mean(xs) { xs = xs.filter(Number.isFinite); return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN; }

function recentMeans(recent) {  // the recent requests' mean TTFT and TPOT (a request's mean ITL), in ms
  recent = recent || [];
  const of = (pick) => mean(recent.map(pick).map(v => (v == null ? NaN : 1000 * v)));
  return { wall: { ttft_ms: of(r => r.ttft_s), itl_ms: of(r => r.tpot_s) },
           modelled: { ttft_ms: of(r => (r.modelled || {}).ttft_s), itl_ms: of(r => (r.modelled || {}).tpot_s) } };
}

function draw(state) {
  const health = state.health || "ok";
  say(health, health.split(/[: ]/)[0]);
  drawMesh(state.mesh);
  drawRequests(state.requests);
  drawFaults(state.faults);
  const lat = state.latency || recentMeans(state.recent);
  for (const [clock, id] of [["wall", "wall"], ["modelled", "mod"]]) {
    document.getElementById(`${id}-ttft`).textContent = fmt((lat[clock] || {}).ttft_ms, 3);
    document.getElementById(`${id}-itl`).textContent = fmt((lat[clock] || {}).itl_ms, 3);
  }
  document.getElementById("counters").textContent =
    Object.entries(state.counters || state.counts || {}).map(([k, v]) => `${k}: ${v}`).join("   ");
}

// the server's API key, when it has one: given once as /#key=KEY (a fragment never reaches a server's log), kept
// for the tab's life; sent as "Authorization: Bearer KEY" with every read
const KEY = (() => {
  const m = location.hash.match(/key=([^&]+)/);
  if (m) { sessionStorage.setItem("waferrt-key", decodeURIComponent(m[1])); history.replaceState(null, "", location.pathname); }
  return sessionStorage.getItem("waferrt-key");
})();
const HEADERS = KEY ? { Authorization: `Bearer ${KEY}` } : {};

function say(text, cls) { const h = document.getElementById("health"); h.textContent = text; h.className = cls; }

let fetching = false, again = false;
async function refresh() {  // read the state; one read at a time, one more if asked meanwhile
  if (fetching) { again = true; return; }
  fetching = true;
  try {
    const r = await fetch("/v1/wafer/state", { cache: "no-store", headers: HEADERS });
    if (r.ok) draw(await r.json());
    else say(r.status === 401 ? "401: open this page as /#key=KEY" : `HTTP ${r.status}`, "down");
  } catch (e) {
    say("offline", "offline");
  } finally {
    fetching = false;
    if (again) { again = false; setTimeout(refresh, 100); }
  }
}

function handle(payload) {
  let data = null;
  try { data = JSON.parse(payload); } catch (e) { return; }
  if (data && (data.mesh || data.requests)) draw(data); else refresh();
}

async function follow() {  // the event stream, read with fetch (an EventSource cannot send the key); again on loss
  const feed = document.getElementById("feed");
  for (;;) {
    try {
      const r = await fetch("/v1/wafer/events", { headers: HEADERS, cache: "no-store" });
      if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
      feed.textContent = "live";
      const reader = r.body.getReader(), decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const event = buffer.slice(0, cut); buffer = buffer.slice(cut + 2);
          const data = event.split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5).trim()).join("\n");
          if (data) handle(data);
        }
      }
    } catch (e) { /* polled meanwhile */ }
    feed.textContent = "polling";
    await new Promise(ok => setTimeout(ok, 2000));
  }
}

refresh();
follow();
setInterval(() => { if (document.getElementById("feed").textContent !== "live") refresh(); }, 1000);
