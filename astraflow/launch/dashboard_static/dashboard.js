// The AstraFlow dashboard: reads /api/summary and /api/transcripts (read-only) and draws them.
"use strict";
const TOKEN = new URLSearchParams(location.search).get("token") || "";
const api = (path) =>
  fetch(path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(TOKEN))
    .then((r) => { if (!r.ok) throw new Error(path + ": " + r.status); return r.json(); });
const el = (tag, attrs = {}, ...kids) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
};
const fmt = (v, nd = 3) => (v === null || v === undefined ? "-" : typeof v === "number" ? v.toFixed(nd) : String(v));
const last = (s) => (s && s.y && s.y.length ? s.y[s.y.length - 1] : null);
const counts = (d) => Object.entries(d || {}).map(([k, v]) => `${k} ${v}`).join(", ") || "-";

const GROUPS = ["learning", "data", "system"];
const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"];
// the headline figures: a card even without data, saying why it is blank
const HEADLINE = {
  learning: [["reward_mean", "mean reward (train groups)", "reward"], ["accuracy", "held-out accuracy (greedy)", "eval_accuracy"]],
  data: [["samples_per_s", "trained samples / s", "throughput"], ["staleness_mean", "mean staleness (versions)", "staleness"]],
};

// One chart per figure the run logged, grouped (learning, data, system): every series of
// /api/summary's series.groups, so a new metric appears without a change here.
function drawCharts(series) {
  const box = document.getElementById("charts");
  box.replaceChildren();
  const groups = (series && series.groups) || {};
  const errored = (series && series.errored_evals) || {};
  const cards = [];
  for (const g of GROUPS) {
    const grid = el("div", { class: "charts" });
    const group = el("div", { class: "group", "data-group": g }, el("h3", {}, g), grid);
    if (g === "learning") {
      for (const [policy, evals] of Object.entries(errored)) {
        for (const e of evals) {
          group.insertBefore(el("div", { class: "problem", "data-errored-eval": e.step },
            `${policy}: the evaluation at step ${e.step}${e.task_set ? " (" + e.task_set + ")" : ""} errored on all ${e.errors} tasks: not charted as accuracy`), grid);
        }
      }
    }
    box.append(group);
    const list = groups[g] || [];
    const notes = (series && series.notes) || {};
    for (const [key, title, note] of HEADLINE[g] || []) {
      if (!list.some((s) => s.key === key || s.key.startsWith(key + "/"))) {
        grid.append(el("div", { class: "chart", "data-chart": key }, el("h3", {}, title), el("div", { class: "note" }, notes[note] || "no data yet")));
      }
    }
    if (!list.length && !(HEADLINE[g] || []).length) grid.append(el("div", { class: "note" }, "nothing logged in this group yet"));
    for (const s of list) {
      const card = el("div", { class: "chart", "data-chart": s.key }, el("h3", {}, s.title));
      grid.append(card);
      cards.push([s, card]);
    }
  }
  // every card first, then the charts: each is as wide as its grid cell once all are placed
  for (const [s, card] of cards) {
    const names = Object.keys(s.policies).filter((p) => s.policies[p].x.length);
    const xs = [...new Set(names.flatMap((p) => s.policies[p].x))].sort((a, b) => a - b);
    const data = [xs, ...names.map((p) => {
      const m = new Map(s.policies[p].x.map((x, i) => [x, s.policies[p].y[i]]));
      return xs.map((x) => (m.has(x) ? m.get(x) : null));
    })];
    new uPlot({
      width: Math.max(260, card.clientWidth - 4), height: 180,
      scales: { x: { time: false } },
      series: [{ label: "step" }, ...names.map((p, i) => ({ label: p, stroke: COLORS[i % COLORS.length], spanGaps: true, points: { show: xs.length < 3 || s.key.startsWith("accuracy") } }))],
      axes: [{ label: "trainer step" }, {}],
    }, data, card);
  }
}

function drawStatus(summary) {
  const st = summary.status;
  document.getElementById("run").textContent = "AstraFlow · " + (summary.run || "run");
  const state = document.getElementById("state");
  const fin = summary.final;
  const outcome = fin && fin.outcome;
  state.textContent = summary.live ? "running" : outcome ? "finished: " + outcome : "finished";
  state.className = summary.live ? "live" : outcome && outcome !== "done" ? "failed" : "done";
  const ended = document.getElementById("ended");
  ended.replaceChildren();
  if (!summary.live && fin && fin.reason) {
    ended.append(el("div", { class: outcome === "done" ? "done" : "problem", "data-stop-reason": outcome },
      `ended${fin.ended ? " " + new Date(fin.ended * 1000).toLocaleString() : ""}: ${fin.reason}` + (fin.services ? ` · ${fin.services}` : "")));
  }
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  const tbody = document.querySelector("#policies tbody");
  tbody.replaceChildren();
  const series = (summary.series && summary.series.policies) || {};
  const names = new Set([...Object.keys(series), ...Object.keys((st && st.policies) || {})]);
  for (const name of [...names].sort()) {
    const p = (st && st.policies && st.policies[name]) || {};
    const s = series[name] || {};
    tbody.append(el("tr", { "data-policy": name },
      el("td", {}, name + (p.trainable === false ? " (frozen)" : "")),
      el("td", {}, p.steps !== undefined ? `${p.steps}/${p.max_steps}` : fmt(s.reward && s.reward.x.slice(-1)[0], 0)),
      el("td", {}, fmt(p.latest_version, 0)),
      el("td", { "data-field": "reward" }, fmt(last(s.reward))),
      el("td", { "data-field": "accuracy" }, fmt(last(s.accuracy))),
      el("td", {}, fmt(last(s.samples_per_s), 1)),
      el("td", {}, fmt(last(s.staleness), 2)),
      el("td", {}, p.buffer_groups !== undefined ? `${p.buffer_groups} groups` : "-"),
      el("td", { "data-field": "dropped" }, counts(p.dropped))));
  }
  const problems = document.getElementById("problems");
  problems.replaceChildren();
  for (const [reason, e] of Object.entries((st && st.errors) || {})) {
    problems.append(el("div", { class: "problem" }, `failed episodes: ${reason}: ${e.count} — ${e.first}`));
  }
  const nodes = document.querySelector("#nodes tbody");
  nodes.replaceChildren();
  for (const n of (st && st.nodes) || []) {
    nodes.append(el("tr", {},
      el("td", {}, n.name || n.id), el("td", {}, n.region), el("td", {}, n.state),
      el("td", {}, Object.entries(n.versions).map(([k, v]) => `${k}:v${v}`).join(" ")),
      el("td", {}, fmt(n.episodes_per_s, 2)), el("td", {}, fmt(n.metrics.tokens_per_s, 0)),
      el("td", {}, fmt(n.metrics.weight_sync_s, 3)), el("td", {}, fmt(n.metrics.errors, 0))));
  }
  const sum = st && st.node_summary;
  const shown = ((st && st.nodes) || []).filter((n) => n.state !== "left").length;
  if (sum && sum.active + sum.silent > shown) {
    nodes.append(el("tr", {}, el("td", { colspan: 8, class: "note" },
      `${shown} of ${sum.active + sum.silent} registered nodes shown: ${sum.active} active, ${sum.silent} silent, ${sum.left} left, ${fmt(sum.episodes_per_s, 2)} episodes/s`)));
  }
  if (!st) nodes.append(el("tr", {}, el("td", { colspan: 8, class: "note" }, "no live service: node figures are shown while the run runs")));
}

async function loadEpisodes() {
  const failed = document.getElementById("failed").checked;
  const step = document.getElementById("step").value;
  let q = "/api/transcripts?limit=100";
  if (failed) q += "&failed=true";
  if (step !== "") q += "&step=" + encodeURIComponent(step);
  const { transcripts } = await api(q);
  const tbody = document.querySelector("#episodes tbody");
  tbody.replaceChildren();
  for (const t of transcripts) {
    const row = el("tr", { class: "pick", "data-episode": t.episode_id },
      el("td", {}, t.step), el("td", {}, t.episode_id), el("td", {}, t.task_id),
      el("td", {}, t.finish_reason + (t.error ? " (error)" : "")),
      el("td", {}, Object.entries(t.rewards).map(([r, v]) => `${r} ${fmt(v)}`).join(", ") || "-"),
      el("td", {}, t.error || t.answer));
    row.addEventListener("click", () => openEpisode(t.episode_id));
    tbody.append(row);
  }
  if (!transcripts.length) tbody.append(el("tr", {}, el("td", { colspan: 6, class: "note" }, "no episodes kept (logging.transcripts_per_step)")));
}

async function openEpisode(id) {
  const v = await api("/api/transcripts/" + encodeURIComponent(id));
  const box = document.getElementById("viewer");
  box.hidden = false;
  document.getElementById("viewer-title").textContent = `${id} · step ${v.record.step}`;
  const meta = document.getElementById("viewer-meta");
  meta.replaceChildren(...v.roles.map((r) => el("div", { "data-role": r.role },
    `role ${r.role} → policy ${r.policy} · reward ${fmt(r.reward)} · advantage ${fmt(r.advantage)}`)));
  if (v.record.error) meta.append(el("div", { class: "problem" }, "error: " + v.record.error));
  meta.append(el("div", {}, "finish reason: " + v.record.finish_reason));
  const turns = document.getElementById("viewer-turns");
  turns.replaceChildren(...v.turns.map((t) => el("div", { class: "turn " + t.source },
    el("span", { class: "who" }, `${t.role} · ${t.source === "policy" ? "generated by " + (v.record.policy[t.role] || t.role) : "context"}` +
      (t.versions.length ? ` · v${t.versions.join(",")}` : "") + ` · ${t.tokens} tokens`), t.text)));
  const tokens = document.getElementById("viewer-tokens");
  tokens.replaceChildren();
  for (const r of v.roles) {
    const line = el("div", { class: "tokens", "data-role": r.role }, el("b", {}, r.role + ": "));
    for (const tok of r.tokens) {
      const title = tok.mask ? `log-prob ${fmt(tok.logprob, 4)} · v${tok.version}` : "context";
      line.append(el("span", { class: "tok m" + tok.mask, title, "data-logprob": tok.logprob ?? "", "data-version": tok.version ?? "" }, tok.text));
    }
    if (r.cut) line.append(el("i", {}, " … (cut)"));
    tokens.append(line);
  }
  box.scrollIntoView();
}

async function refresh() {
  try {
    const summary = await api("/api/summary");
    drawStatus(summary);
    drawCharts(summary.series);
    return summary.live;
  } catch (e) {
    document.getElementById("updated").textContent = String(e);
    return true;
  }
}

document.getElementById("failed").addEventListener("change", loadEpisodes);
document.getElementById("step").addEventListener("change", loadEpisodes);
(async () => {
  const live = await refresh();
  await loadEpisodes();
  if (live) setInterval(async () => { if (await refresh()) loadEpisodes(); }, 5000);
})();
