// Cormorant console: a small single-page UI over the admin API (/api), plain JavaScript.
// Views are chosen by the URL's hash (#/overview, #/sessions, #/session/<id>, ...); the
// bearer token from POST /api/login lives in sessionStorage (gone when the tab closes).

const $ = (selector) => document.querySelector(selector);
const TOKEN = "cormorant-token";
const USER = "cormorant-user";
const PAGE = 50;
const number = new Intl.NumberFormat();
const decimal = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

let timers = [];

// ---------------------------------------------------------------- API

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = { ...(options.headers || {}) };
  const token = sessionStorage.getItem(TOKEN);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    ...options,
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 401) {
    sessionStorage.removeItem(TOKEN);
    throw new Unauthorized((await response.json()).detail);
  }
  if (response.status === 204) return null;
  const body = await response.json();
  if (!response.ok) {
    const detail = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
    throw new Error(`${response.status}: ${detail}`);
  }
  return body;
}

function query(params) {
  const kept = Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined);
  return kept.length ? `?${new URLSearchParams(kept)}` : "";
}

// ---------------------------------------------------------------- small DOM helpers

function cell(content, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  if (content instanceof Node) td.append(content);
  else td.textContent = content ?? "–";
  return td;
}

function row(cells) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  return tr;
}

function badge(text, kind) {
  const span = document.createElement("span");
  span.className = `badge ${kind}`;
  span.textContent = text;
  return span;
}

function link(text, href) {
  const a = document.createElement("a");
  a.href = href;
  a.textContent = text;
  return a;
}

// A moment (ISO 8601 text or Unix milliseconds) in ISO 8601, in the browser's time zone
// with its UTC offset: 2026-11-27T03:05:09+01:00.
function when(value) {
  if (value === null || value === undefined || value === "") return "–";
  const d = new Date(value);
  const pad = (n) => String(n).padStart(2, "0");
  const offset = -d.getTimezoneOffset();
  const zone = `${offset < 0 ? "-" : "+"}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)}`;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}${zone}`;
}

// Keeps only the rows of a table whose text holds what its search box holds.
function searchable(input, table) {
  const apply = () => {
    const wanted = input.value.trim().toLowerCase();
    document.querySelectorAll(`${table} tbody tr`).forEach((tr) => {
      tr.hidden = Boolean(wanted) && !tr.textContent.toLowerCase().includes(wanted);
    });
  };
  input.oninput = apply;
  return apply;
}

function fill(table, rows, empty) {
  const body = $(`${table} tbody`);
  body.replaceChildren(...rows);
  if (!rows.length) {
    const td = cell(empty);
    td.colSpan = $(`${table} thead tr`).children.length;
    td.className = "hint";
    body.append(row([td]));
  }
}

function pager(id, page, load) {
  const element = $(id);
  const first = page.total ? page.offset + 1 : 0;
  const last = page.offset + page.items.length;
  const previous = document.createElement("button");
  previous.textContent = "← Previous";
  previous.disabled = page.offset === 0;
  previous.onclick = () => load(Math.max(0, page.offset - page.limit));
  const next = document.createElement("button");
  next.textContent = "Next →";
  next.disabled = last >= page.total;
  next.onclick = () => load(page.offset + page.limit);
  const text = document.createElement("span");
  text.textContent = `${number.format(first)}–${number.format(last)} of ${number.format(page.total)}`;
  element.replaceChildren(previous, text, next);
}

function formValues(form) {
  return Object.fromEntries(new FormData(form).entries());
}

// ---------------------------------------------------------------- charts (uPlot, vendored)

// Distinct colours: ten picked by hand, then hues a golden angle apart, so no two series
// of a chart share one however many stages there are.
const PALETTE = ["#0b6bcb", "#e07b00", "#7b3fb0", "#1a7f37", "#c62828", "#00838f", "#ad1457", "#6d4c41", "#546e7a", "#9e9d24"];

function colour(index) {
  return index < PALETTE.length ? PALETTE[index] : `hsl(${Math.round((index * 137.508) % 360)} 70% 38%)`;
}

// A series' name as shown: never blank.
function seriesName(name) {
  return String(name ?? "").trim() || "unnamed series";
}

// The figures under the cursor, in a box beside it (uPlot plugin).
function tooltip(format) {
  let box;
  return {
    hooks: {
      init: (u) => {
        box = document.createElement("div");
        box.className = "chart-tip";
        box.hidden = true;
        u.over.append(box);
      },
      setCursor: (u) => {
        const i = u.cursor.idx;
        if (i === null || i === undefined || u.data[0][i] === undefined) {
          box.hidden = true;
          return;
        }
        const lines = [when(u.data[0][i] * 1000)];
        u.series.forEach((s, k) => {
          if (k && s.show) lines.push(`${s.label}: ${u.data[k][i] === null ? "–" : format(u.data[k][i])}`);
        });
        box.replaceChildren(...lines.map((text) => {
          const line = document.createElement("div");
          line.textContent = text;
          return line;
        }));
        box.hidden = false;
        const left = u.cursor.left, width = u.over.clientWidth;
        box.style.left = `${left > width / 2 ? left - box.offsetWidth - 12 : left + 12}px`;
        box.style.top = `${Math.max(0, u.cursor.top - box.offsetHeight / 2)}px`;
      },
    },
  };
}

const charts = new Map();

// Tick steps of charts of whole numbers (connections, records): no tick between two.
const WHOLE_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7, 1e8, 1e9];

// Draws series (name → values, over the shared times in seconds) in the element; the
// chart is made again only when its series change, and keeps a zoom the user chose.
// `whole`: the values are whole numbers.
function lineChart(element, times, series, format, whole = false) {
  const names = Object.keys(series);
  const key = names.join("\u0000");
  let chart = charts.get(element.id);
  if (chart && (chart.key !== key || !element.contains(chart.plot.root))) {
    chart.plot.destroy();
    chart = undefined;
  }
  const data = [times, ...names.map((name) => series[name])];
  const width = element.clientWidth || 400;
  if (!chart) {
    const state = { key, zoomed: false };
    state.plot = new uPlot({
      width,
      height: 170,
      series: [
        { value: (u, t) => (t === null ? "–" : when(t * 1000)) },
        ...names.map((name, index) => ({
          label: seriesName(name), stroke: colour(index), width: 2,
          value: (u, v) => (v === null ? "–" : format(v)),
        })),
      ],
      axes: [
        // Times on the axis as in the rest of the console: 24-hour clock, browser's zone.
        { values: (u, ticks) => ticks.map((t) => when(t * 1000).slice(11, 19)) },
        { size: 60, values: (u, ticks) => ticks.map(format), ...(whole ? { incrs: WHOLE_STEPS } : {}) },
      ],
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max)] } },
      cursor: { drag: { x: true, y: false } },
      hooks: { setSelect: [(u) => { if (u.select.width > 0) state.zoomed = true; }] },
      plugins: [tooltip(format)],
    }, data, element);
    state.plot.over.addEventListener("dblclick", () => { state.zoomed = false; });
    charts.set(element.id, state);
    return;
  }
  if (chart.plot.width !== width) chart.plot.setSize({ width, height: 170 });
  chart.plot.setData(data, !chart.zoomed);
}

// ---------------------------------------------------------------- views

async function showOverview() {
  const zone = when(Date.now()).slice(19);
  $("#range-zone").textContent = zone;
  const refreshStats = async () => {
    const stats = await api(`/api/stats${query({ seconds: $("#range").value })}`);
    const current = stats.current;
    if (!current) return;
    $("#connections").textContent = number.format(current.connections);
    $("#msg-in").textContent = decimal.format(current.msg_in_per_second);
    $("#msg-out").textContent = decimal.format(current.msg_out_per_second);
    const lags = Object.values(current.lag);
    $("#lag-total").textContent = number.format(Math.round(lags.reduce((a, b) => a + b, 0)));
    const history = stats.history;
    const times = history.map((s) => Date.parse(s.at) / 1000);
    const count = (v) => number.format(Math.round(v));
    const rate = (v) => (v >= 10 ? number.format(Math.round(v)) : decimal.format(v));
    lineChart($("#chart-connections"), times, { connections: history.map((s) => s.connections) }, count, true);
    // The first sample has no rate yet: it is left out (null) of the rate chart.
    lineChart($("#chart-rates"), times, {
      in: history.map((s, i) => (i ? s.msg_in_per_second : null)),
      out: history.map((s, i) => (i ? s.msg_out_per_second : null)),
    }, rate);
    const stages = [...new Set(history.flatMap((s) => Object.keys(s.lag)))].sort();
    lineChart($("#chart-lag"), times, Object.fromEntries(
      stages.map((stage) => [seriesName(stage), history.map((s) => s.lag[stage] ?? 0)]),
    ), count, true);
  };
  $("#range").onchange = () => {
    for (const chart of charts.values()) chart.zoomed = false;
    refreshStats().catch(report);
  };
  const refreshCluster = async () => {
    const cluster = await api("/api/cluster");
    const ready = cluster.services.filter((s) => s.ready).length;
    $("#tile-ready").textContent = `${ready} / ${cluster.services.length}`;
    fill("#services", cluster.services.map((s) => row([
      cell(s.name),
      cell(s.service || "?"),
      cell(s.node_id),
      cell(s.version),
      cell(s.error ? badge("unreachable", "bad") : s.ready ? badge("ready", "ok") : badge("not ready", "bad")),
      cell(s.connections === null ? "" : number.format(s.connections)),
      cell(s.lag === null ? "" : number.format(s.lag)),
      cell(s.error || Object.entries(s.checks).filter(([, v]) => v !== "ok").map(([k, v]) => `${k}: ${v}`).join("; ") || "all ok"),
    ])), "No service found: is cluster_endpoints set?");
    $("#kafka").textContent = `Kafka: ${cluster.kafka_bootstrap} · admin ${cluster.admin_version}`;
  };
  await Promise.all([refreshStats(), refreshCluster()]);
  timers.push(setInterval(() => refreshStats().catch(report), 2000));
  timers.push(setInterval(() => refreshCluster().catch(report), 5000));
}

let sessionFilters = {};

async function loadSessions(offset = 0) {
  const page = await api(`/api/sessions${query({ ...sessionFilters, offset, limit: PAGE })}`);
  fill("#sessions", page.items.map((s) => row([
    cell(link(s.client_id, `#/session/${encodeURIComponent(s.client_id)}`)),
    cell(s.connected ? badge("connected", "ok") : badge("disconnected", "idle")),
    cell(s.node_id),
    cell(s.client_address),
    cell(s.protocol_version),
    cell(s.kind),
    cell(s.persistent ? "yes" : "no"),
    cell(when(s.connected_at)),
    cell(number.format(s.subscriptions)),
  ])), "No session matches.");
  pager("#sessions-pager", page, loadSessions);
}

async function showSessions() {
  const form = $("#sessions-form");
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionFilters = formValues(form);
    loadSessions().catch(report);
  };
  await loadSessions();
  timers.push(setInterval(() => loadSessions().catch(report), 5000));
}

async function showSession(clientId) {
  const message = $("#session-message");
  message.textContent = "";
  const render = async () => {
    let s;
    try {
      s = await api(`/api/sessions/${encodeURIComponent(clientId)}`);
    } catch (error) {
      if (error instanceof Unauthorized) throw error;
      $("#session-title").textContent = clientId;
      $("#session-facts").replaceChildren();
      message.textContent = "This session does not exist (any more).";
      $("#session-disconnect").disabled = $("#session-delete").disabled = true;
      fill("#session-subscriptions", [], "");
      return;
    }
    $("#session-title").textContent = s.client_id;
    // What each protocol version has: MQTT 3.1.1 has Clean Session and no Session Expiry
    // Interval or Receive Maximum (3.1.2.4); MQTT 5.0 has Clean Start and both (3.1.2.11).
    const v5 = s.protocol_version === "5.0";
    const versioned = v5 ? [
      ["Clean Start", s.clean_start ? "1" : "0"],
      ["Session Expiry Interval", `${number.format(s.session_expiry_interval)} s`],
    ] : [
      ["Clean Session", s.clean_start ? "1: the session ends with its connection" : "0: the session is kept"],
    ];
    const facts = [
      ["State", s.connected ? "connected" : "disconnected"],
      ["Node", s.node_id],
      ["Client address", s.client_address ?? "unknown"],
      ["Connected since", when(s.connected_at)],
      ["Protocol", `MQTT ${s.protocol_version}`],
      ["Kind", s.kind],
      ["Persistent session", s.persistent ? "yes" : "no"],
      ...versioned,
      ["Kept when disconnected", !s.persistent ? "no: it ends with its connection"
        : s.kept_seconds === null ? "for ever" : `${number.format(s.kept_seconds)} s`],
      ...(v5 ? [["Receive Maximum", number.format(s.receive_maximum)]] : []),
      ["Stored messages", s.stored_messages === null ? "–" : number.format(s.stored_messages)],
      // Messages lost to CORMORANT_PERSISTED_MAX_MESSAGES: shown in red when there are any.
      ["Dropped by the store's cap", s.dropped_messages === null ? "–"
        : number.format(s.dropped_messages), s.dropped_messages > 0],
      ["Topic backlog (APPLICATION)", s.app_lag === null ? "–" : number.format(s.app_lag)],
      ["Last record", when(s.updated_at)],
    ];
    $("#session-facts").replaceChildren(...facts.flatMap(([term, value, bad]) => {
      const dt = document.createElement("dt");
      dt.textContent = term;
      const dd = document.createElement("dd");
      dd.textContent = value;
      dd.classList.toggle("bad", Boolean(bad));
      return [dt, dd];
    }));
    $("#session-disconnect").disabled = !s.connected;
    $("#session-delete").disabled = false;
    fill("#session-subscriptions", s.subscription_list.map((sub) => row([
      cell(sub.topic_filter), cell(String(sub.qos)), cell(sub.no_local ? "yes" : "no"),
      cell(sub.retain_as_published ? "yes" : "no"), cell(String(sub.retain_handling)),
      cell(sub.subscription_identifier === null ? "–" : String(sub.subscription_identifier)),
    ])), "No subscription.");
  };
  const path = `/api/sessions/${encodeURIComponent(clientId)}`;
  $("#session-disconnect").onclick = async () => {
    if (!confirm(`Disconnect ${clientId}? Its session stays.`)) return;
    try {
      await api(`${path}/disconnect`, { method: "POST" });
      message.textContent = "Disconnect sent.";
    } catch (error) { report(error); }
  };
  $("#session-delete").onclick = async () => {
    if (!confirm(`Delete the session of ${clientId}, with its subscriptions and stored messages?`)) return;
    try {
      await api(path, { method: "DELETE" });
      message.textContent = "Session deleted.";
    } catch (error) { report(error); }
  };
  await render();
  timers.push(setInterval(() => render().catch(report), 3000));
}

async function showSubscriptions() {
  const form = $("#subscriptions-form");
  const load = async (offset = 0) => {
    const page = await api(`/api/subscriptions${query({ ...formValues(form), offset, limit: PAGE })}`);
    fill("#subscriptions", page.items.map((sub) => row([
      cell(link(sub.client_id, `#/session/${encodeURIComponent(sub.client_id)}`)),
      cell(sub.topic_filter), cell(String(sub.qos)), cell(sub.no_local ? "yes" : "no"),
      cell(sub.retain_as_published ? "yes" : "no"), cell(String(sub.retain_handling)),
    ])), "No subscription matches.");
    pager("#subscriptions-pager", page, load);
  };
  form.onsubmit = (event) => { event.preventDefault(); load().catch(report); };
  await load();
}

async function showRetained() {
  const form = $("#retained-form");
  const load = async (offset = 0) => {
    const { filter } = formValues(form);
    const page = await api(`/api/retained${query({ filter, offset, limit: PAGE })}`);
    fill("#retained", page.items.map((m) => {
      const remove = document.createElement("button");
      remove.className = "link";
      remove.textContent = "Delete";
      remove.onclick = async () => {
        if (!confirm(`Delete the retained message of ${m.topic}?`)) return;
        try {
          await api(`/api/retained${query({ topic: m.topic })}`, { method: "DELETE" });
          remove.closest("tr").remove();
        } catch (error) { report(error); }
      };
      const payload = m.payload_encoding === "utf-8" ? m.payload : `base64: ${m.payload}`;
      return row([
        cell(m.topic), cell(String(m.qos)), cell(`${number.format(m.payload_size)} B`),
        cell(payload, "payload"), cell(when(m.received_at)), cell(remove),
      ]);
    }), "No retained message matches.");
    pager("#retained-pager", page, load);
  };
  form.onsubmit = (event) => { event.preventDefault(); load().catch(report); };
  await load();
}

// Rules as operators write them (one per line, "allow publish sensors/#") and as the API
// takes them ({permission, action, topic}).
function parseRules(text) {
  return text.split("\n").map((line) => line.trim()).filter(Boolean).map((line) => {
    const [permission, action, ...topic] = line.split(/\s+/);
    if (!topic.length) throw new Error(`"${line}": a rule is <allow|deny> <publish|subscribe|all> <Topic Filter>`);
    return { permission: permission.toLowerCase(), action: action.toLowerCase(), topic: topic.join(" ") };
  });
}

function rulesText(rules) {
  return rules.map((r) => `${r.permission} ${r.action} ${r.topic}`).join("\n");
}

function identity(c) {
  if (c.type === "X509" && c.certificate) {
    const m = c.certificate;
    return m.fingerprint ? `certificate ${m.fingerprint.slice(0, 16)}…` : `certificate ${m.common_name ? `CN ${m.common_name}` : `SAN ${m.san}`}`;
  }
  if (c.type === "JWT" && c.jwt) return `tokens of ${c.jwt.issuer || "any issuer"} (${c.jwt.algorithms.join(", ")})`;
  const parts = [];
  if (c.username) parts.push(`user ${c.username}`);
  if (c.client_id) parts.push(`client ${c.client_id}`);
  return parts.join(", ");
}

// What each credential type is, shown under the type select (the select itself only
// names the types, so it is never cut).
const CREDENTIAL_TYPES = {
  MQTT_BASIC: "User name and password in CONNECT (or a Client Identifier alone).",
  SCRAM: "SCRAM-SHA-256/512: MQTT 5 enhanced authentication; the password never travels.",
  X509: "A client certificate on the TLS listeners, recognised by fingerprint, Common Name or Subject Alternative Name.",
  JWT: "A signed token (JWS) sent as the CONNECT Password, checked with a key or the issuer's JWKS.",
};

// The API body of the new-credential form's values.
function newCredential(values) {
  const body = { name: values.name, type: values.type, kind: values.kind, rules: parseRules(values.rules) };
  if (values.type === "MQTT_BASIC" || values.type === "SCRAM") {
    if (values.username) body.username = values.username;
    if (values.password) body.password = values.password;
    if (values.client_id && values.type === "MQTT_BASIC") body.client_id = values.client_id;
  } else if (values.type === "X509") {
    body.certificate = { [values.cert_by]: values.cert_value.trim() };
  } else {
    const jwt = {
      algorithms: values.jwt_algorithms.split(",").map((a) => a.trim()).filter(Boolean),
      key: values.jwt_key.trim(),
    };
    for (const field of ["issuer", "audience", "jwks_url", "client_id_claim", "username_claim"]) {
      if (values[`jwt_${field}`]) jwt[field] = values[`jwt_${field}`].trim();
    }
    if (jwt.jwks_url) jwt.key = "";
    body.jwt = jwt;
  }
  return body;
}

async function showCredentials() {
  const message = $("#credentials-message");
  const form = $("#credentials-add-form");
  const search = searchable($("#credentials-search"), "#credentials");
  let credentials = [];
  const showType = () => {
    const type = $("#credential-type").value;
    $("#credential-type-hint").textContent = CREDENTIAL_TYPES[type];
    form.querySelectorAll("[data-types]").forEach((label) => {
      label.hidden = !label.dataset.types.split(" ").includes(type);
    });
  };
  const editRules = () => {
    const chosen = credentials.find((c) => c.name === $("#credential-rules-name").value);
    $("#credential-rules-edit").value = chosen ? rulesText(chosen.rules) : "";
  };
  const choices = (select, names) => {
    const kept = select.value;
    select.replaceChildren(...names.map((name) => new Option(name, name, false, name === kept)));
  };
  const load = async () => {
    credentials = (await api("/api/credentials")).credentials;
    fill("#credentials", credentials.map((c) => {
      const toggle = document.createElement("button");
      toggle.className = "link";
      toggle.textContent = c.enabled ? "Disable" : "Enable";
      toggle.onclick = async () => {
        try {
          await api(`/api/credentials/${encodeURIComponent(c.name)}`, { method: "PATCH", body: { enabled: !c.enabled } });
          message.textContent = `${c.name} ${c.enabled ? "disabled: its clients are disconnected" : "enabled"}.`;
          await load();
        } catch (error) { report(error); }
      };
      const remove = document.createElement("button");
      remove.className = "link";
      remove.textContent = "Delete";
      remove.onclick = async () => {
        if (!confirm(`Delete credential ${c.name}? Its clients are disconnected and can no longer connect.`)) return;
        try {
          await api(`/api/credentials/${encodeURIComponent(c.name)}`, { method: "DELETE" });
          message.textContent = `${c.name} deleted.`;
          await load();
        } catch (error) { report(error); }
      };
      const actions = document.createElement("span");
      actions.append(toggle, remove);
      return row([
        cell(c.name), cell(c.type), cell(c.kind), cell(identity(c)),
        cell(c.password === undefined || c.password === null ? "–" : c.password),
        cell(c.rules.length ? rulesText(c.rules) : "nothing allowed", "rules"),
        cell(c.enabled ? badge("enabled", "ok") : badge("disabled", "bad")),
        cell(actions),
      ]);
    }), "No credential yet: clients connect anonymously where that is allowed.");
    search();
    choices($("#credential-rules-name"), credentials.map((c) => c.name));
    choices($("#credential-password-name"), credentials
      .filter((c) => c.type === "MQTT_BASIC" || c.type === "SCRAM").map((c) => c.name));
    editRules();
  };
  $("#credential-type").onchange = showType;
  showType();
  $("#credential-rules-name").onchange = editRules;
  form.onsubmit = async (event) => {
    event.preventDefault();
    try {
      const body = newCredential(formValues(form));
      await api("/api/credentials", { method: "POST", body });
      form.reset();
      showType();
      message.textContent = `${body.name} created: clients may connect with it.`;
      await load();
    } catch (error) { report(error); }
  };
  $("#credentials-password-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = formValues(event.target);
    try {
      await api(`/api/credentials/${encodeURIComponent(values.name)}`, {
        method: "PATCH", body: { password: values.password },
      });
      $("#credential-password-new").value = "";
      message.textContent = `Password of ${values.name} reset.`;
    } catch (error) { report(error); }
  };
  $("#credentials-rules-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = formValues(event.target);
    try {
      await api(`/api/credentials/${encodeURIComponent(values.name)}`, {
        method: "PATCH", body: { rules: parseRules(values.rules) },
      });
      message.textContent = `Rules of ${values.name} saved.`;
      await load();
    } catch (error) { report(error); }
  };
  await load();
}

async function showBlocked() {
  const message = $("#blocked-message");
  const search = searchable($("#blocked-search"), "#blocked");
  const load = async () => {
    const { blocked } = await api("/api/blocked");
    fill("#blocked", blocked.map((b) => {
      const remove = document.createElement("button");
      remove.className = "link";
      remove.textContent = "Unblock";
      remove.onclick = async () => {
        try {
          await api(`/api/blocked/${encodeURIComponent(b.id)}`, { method: "DELETE" });
          message.textContent = `${b.kind} ${b.value} unblocked.`;
          await load();
        } catch (error) { report(error); }
      };
      return row([
        cell(b.kind), cell(b.value), cell(b.reason || "–"),
        cell(b.expires_at_ms === null ? "never" : when(b.expires_at_ms)), cell(b.created_by), cell(remove),
      ]);
    }), "No client is blocked.");
    search();
  };
  $("#blocked-add-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = formValues(event.target);
    try {
      const body = { kind: values.kind, value: values.value, reason: values.reason };
      if (values.minutes) body.expires_in_seconds = Number(values.minutes) * 60;
      await api("/api/blocked", { method: "POST", body });
      event.target.reset();
      message.textContent = `${body.kind} ${body.value} blocked.`;
      await load();
    } catch (error) { report(error); }
  };
  await load();
}

// ---------------------------------------------------------------- integrations

// An integration's state as a badge: running is fine, disabled is idle, the rest is trouble.
const INTEGRATION_STATES = { running: "ok", disabled: "idle", starting: "idle" };

// The figures of an integration's status shown in columns of their own; every other one
// (a sink's own, such as the webhook's dead-lettered) goes in "Other figures".
const INTEGRATION_COLUMNS = ["messages_sent", "messages_failed", "messages_retried", "lag_records"];

async function showIntegrations() {
  const message = $("#integrations-message");
  const search = searchable($("#integrations-search"), "#integrations");
  const load = async () => {
    const { integrations } = await api("/api/integrations");
    fill("#integrations", integrations.map((i) => {
      const status = i.status;
      const figures = status ? status.counters : {};
      const figure = (name) => cell(figures[name] === undefined ? "–" : number.format(figures[name]));
      const others = Object.entries(figures)
        .filter(([name]) => !INTEGRATION_COLUMNS.includes(name) && !name.endsWith("_timestamp_seconds"))
        .map(([name, value]) => `${name}: ${number.format(value)}`).join(" · ");
      const toggle = document.createElement("button");
      toggle.className = "link";
      toggle.textContent = i.enabled ? "Disable" : "Enable";
      toggle.onclick = async () => {
        try {
          await api(`/api/integrations/${encodeURIComponent(i.name)}`, { method: "PATCH", body: { enabled: !i.enabled } });
          message.textContent = `${i.name} ${i.enabled ? "disabled" : "enabled"}.`;
          await load();
        } catch (error) { report(error); }
      };
      const state = status ? status.state : "–";
      const error = status && status.last_error ? `${when(status.last_error_at)} ${status.last_error}` : "none";
      return row([
        cell(i.name), cell(i.kind), cell(i.enabled ? "yes" : "no"),
        cell(i.topic_filters.join(" ")),
        figure("messages_sent"), figure("messages_failed"), figure("messages_retried"), figure("lag_records"),
        cell(others || "–"),
        cell(badge(state, INTEGRATION_STATES[state] || "bad")),
        cell(error, "wrap"),
        cell(toggle),
      ]);
    }), "No integration yet: cormorant integrations add NAME ... adds one.");
    search();
  };
  await load();
  timers.push(setInterval(() => load().catch(report), 3000));
}

async function showAudit() {
  const search = searchable($("#audit-search"), "#audit");
  const load = async (offset = 0) => {
    const page = await api(`/api/audit${query({ offset, limit: PAGE })}`);
    fill("#audit", page.items.map((e) => row([
      cell(when(e.at)), cell(e.username), cell(e.action), cell(e.target),
      cell(e.status < 300 ? badge(String(e.status), "ok") : badge(String(e.status), "bad")),
    ])), "Nothing audited yet.");
    search();
    pager("#audit-pager", page, load);
  };
  await load();
}

async function showUsers() {
  const message = $("#users-message");
  const me = sessionStorage.getItem(USER);
  const search = searchable($("#users-search"), "#users");
  const load = async () => {
    const { usernames } = await api("/api/admin-users");
    fill("#users", usernames.map((name) => {
      const remove = document.createElement("button");
      remove.className = "link";
      remove.textContent = "Remove";
      remove.disabled = name === me;
      remove.title = name === me ? "You cannot remove yourself." : "";
      remove.onclick = async () => {
        if (!confirm(`Remove admin user ${name}? Its tokens stop working.`)) return;
        try {
          await api(`/api/admin-users/${encodeURIComponent(name)}`, { method: "DELETE" });
          message.textContent = `${name} removed.`;
          await load();
        } catch (error) { report(error); }
      };
      return row([cell(name === me ? `${name} (you)` : name), cell(remove)]);
    }), "No admin user.");
    search();
    const select = $("#users-password-username");
    select.replaceChildren(...usernames.map((name) => new Option(name, name, false, name === me)));
  };
  $("#users-add-form").onsubmit = async (event) => {
    event.preventDefault();
    const body = formValues(event.target);
    try {
      await api("/api/admin-users", { method: "POST", body });
      event.target.reset();
      message.textContent = `${body.username} added.`;
      await load();
    } catch (error) { report(error); }
  };
  $("#users-password-form").onsubmit = async (event) => {
    event.preventDefault();
    const body = formValues(event.target);
    try {
      await api(`/api/admin-users/${encodeURIComponent(body.username)}/password`, {
        method: "PUT", body: { password: body.password },
      });
      $("#users-password-password").value = "";
      if (body.username === me) {
        sessionStorage.removeItem(TOKEN);
        route();
        return;
      }
      message.textContent = `Password of ${body.username} changed.`;
    } catch (error) { report(error); }
  };
  await load();
}

// ---------------------------------------------------------------- infrastructure

function bytes(value) {
  if (value === null || value === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let n = value, i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${decimal.format(n)} ${units[i]}`;
}

// A definition list of [term, value, bad] rows (bad ones in red).
function facts(selector, pairs) {
  $(selector).replaceChildren(...pairs.flatMap(([term, value, bad]) => {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    dd.textContent = value ?? "–";
    dd.classList.toggle("bad", Boolean(bad));
    return [dt, dd];
  }));
}

function count(value, bad) {
  return value ? badge(number.format(value), "bad") : badge(bad ? "none" : "0", "ok");
}

async function showInfrastructure() {
  const searches = [
    searchable($("#infra-nodes-search"), "#infra-nodes"),
    searchable($("#infra-haproxy-search"), "#infra-haproxy"),
    searchable($("#infra-topics-search"), "#infra-topics"),
  ];
  const render = async () => {
    const infra = await api("/api/infrastructure");
    $("#infra-checked").textContent = when(infra.checked_at);
    const k = infra.kafka;
    $("#infra-brokers-count").textContent = k.reachable ? number.format(k.brokers.length) : "unreachable";
    $("#infra-under-replicated").textContent = k.reachable ? number.format(k.under_replicated_partitions) : "–";
    $("#infra-offline").textContent = k.reachable ? number.format(k.offline_partitions) : "–";
    $("#infra-under-replicated").classList.toggle("bad", k.under_replicated_partitions > 0);
    $("#infra-offline").classList.toggle("bad", k.offline_partitions > 0);
    const partitions = k.topics.reduce((sum, t) => sum + t.partitions, 0);
    $("#infra-kafka").textContent = k.reachable
      ? `Bootstrap ${k.bootstrap}: ${number.format(k.topics.length)} topics, ${number.format(partitions)} partitions.`
      : `Kafka at ${k.bootstrap} did not answer: ${k.error}`;
    fill("#infra-kafka-brokers", k.brokers.map((b) => row([
      cell(String(b.node_id)), cell(`${b.host}:${b.port}`), cell(b.controller ? "active controller" : ""),
    ])), "No broker known.");
    fill("#infra-topics", k.topics.map((t) => row([
      cell(t.topic), cell(number.format(t.partitions)), cell(String(t.replication_factor)),
      cell(t.under_replicated.length ? badge(t.under_replicated.join(", "), "bad") : badge("none", "ok")),
      cell(t.offline.length ? badge(t.offline.join(", "), "bad") : badge("none", "ok")),
    ])), "No topic.");
    const r = infra.redis;
    facts("#infra-redis", !r.used ? [["Used", "no: the message store is PostgreSQL (store_backend postgres)"]]
      : !r.reachable ? [["State", "unreachable", true], ["Error", r.error, true]]
        : [
          ["State", "reachable"], ["Address", r.address],
          ["Role", r.role === "master" ? "primary (master)" : r.role], ["Version", r.version],
          ["Replicas connected", number.format(r.connected_replicas)],
          ["Memory used", bytes(r.used_memory_bytes)],
          ["Memory limit", r.maxmemory_bytes ? bytes(r.maxmemory_bytes) : "none (maxmemory 0)"],
        ]);
    const p = infra.postgres;
    facts("#infra-postgres", p.reachable
      ? [["State", "reachable"], ["Address", p.address], ["Version", p.version], ["Answered in", `${decimal.format(p.latency_ms)} ms`]]
      : [["State", "unreachable", true], ["Address", p.address], ["Error", p.error, true]]);
    const h = infra.haproxy;
    const inRotation = h.servers.filter((x) => x.in_rotation).length;
    $("#infra-rotation").textContent = h.configured ? `${inRotation} / ${h.servers.length}` : "no HAProxy";
    $("#infra-rotation").classList.toggle("bad", inRotation < h.servers.length || h.errors.length > 0);
    const unanswered = h.errors.map((error) => {
      const td = cell(`not answering: ${error}`, "error");
      td.colSpan = 4;
      return row([td]);
    });
    fill("#infra-haproxy", [...unanswered, ...h.servers.map((x) => row([
      cell(x.backend), cell(x.server),
      cell(x.in_rotation ? badge(`in rotation (${x.status})`, "ok") : badge(`out of rotation (${x.status})`, "bad")),
      cell(x.haproxy),
    ]))], h.configured ? "No server." : "No HAProxy stats socket configured (admin_haproxy_stats_sockets); on AWS the Network Load Balancer's target health tells it.");
    fill("#infra-nodes", infra.nodes.map((n) => row([
      cell(n.name), cell(n.service || "?"), cell(n.node_id),
      cell(!n.reachable ? badge("unreachable", "bad") : n.cpu_percent === null ? "measuring…" : `${decimal.format(n.cpu_percent)} %`),
      cell(bytes(n.rss_bytes)),
    ])), "No service process found: is cluster_endpoints set?");
    searches.forEach((search) => search());
  };
  await render();
  timers.push(setInterval(() => render().catch(report), 10000));
}

// ---------------------------------------------------------------- WebSocket client (MQTT.js, vendored)

let mqttLibrary;

// MQTT.js, loaded on the first visit of the page (it is large; the other pages need none).
function loadMqtt() {
  mqttLibrary ??= new Promise((resolve, reject) => {
    const script = document.createElement("script");
    script.src = "/console/vendor/mqtt/mqtt.min.js";
    script.onload = () => resolve(window.mqtt);
    script.onerror = () => { mqttLibrary = undefined; reject(new Error("MQTT.js did not load")); };
    document.head.append(script);
  });
  return mqttLibrary;
}

// The page's client stays connected while the operator looks at other pages.
const ws = { client: null, subscriptions: new Map(), messages: [], refused: false };
const WS_MESSAGES = 500;

function payloadText(payload) {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(payload);
  } catch {
    return `hex: ${[...payload].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
  }
}

async function showWebSocket() {
  const status = $("#ws-status");
  const { mqtt_ws_url: configured } = await api("/api/console/settings");
  $("#ws-allowed").textContent = configured || "none is set";
  if (!$("#ws-url").value) $("#ws-url").value = configured || `ws://${location.hostname}:8083/mqtt`;
  if (!$("#ws-client-id").value) $("#ws-client-id").value = `console-${Math.random().toString(16).slice(2, 10)}`;
  const search = searchable($("#ws-messages-search"), "#ws-messages");
  const renderMessages = () => {
    fill("#ws-messages", ws.messages.map((m) => row([
      cell(when(m.at)), cell(m.topic), cell(String(m.qos)), cell(m.retain ? "yes" : "no"), cell(m.payload, "payload"),
    ])), "No message yet.");
    search();
  };
  const connected = (yes) => {
    $("#ws-connect").disabled = yes;
    $("#ws-disconnect").disabled = !yes;
    document.querySelectorAll("#ws-subscribe-form button, #ws-publish-form button").forEach((b) => { b.disabled = !yes; });
  };
  const renderSubscriptions = () => {
    fill("#ws-subscriptions", [...ws.subscriptions].map(([topic, qos]) => {
      const drop = document.createElement("button");
      drop.type = "button";
      drop.className = "link";
      drop.textContent = "Unsubscribe";
      drop.onclick = () => ws.client.unsubscribe(topic, (error) => {
        if (error) { report(error); return; }
        ws.subscriptions.delete(topic);
        renderSubscriptions();
      });
      return row([cell(topic), cell(String(qos)), cell(drop)]);
    }), "No subscription.");
    connected(Boolean(ws.client && ws.client.connected));
  };
  $("#ws-connect-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = formValues(event.target);
    let library;
    try { library = await loadMqtt(); } catch (error) { report(error); return; }
    if (ws.client) ws.client.end(true);
    ws.subscriptions = new Map();
    ws.refused = false;
    status.textContent = "Connecting…";
    const options = {
      clientId: values.client_id, protocolVersion: Number(values.protocol), clean: $("#ws-clean").checked,
      // One attempt, told as it ends; keep alive timers on the page (no Web Worker: the
      // Content-Security-Policy allows none).
      reconnectPeriod: 0, connectTimeout: 10_000, timerVariant: "native",
    };
    if (values.username) options.username = values.username;
    if (values.password) options.password = values.password;
    const client = library.connect(values.url, options);
    ws.client = client;
    const version = values.protocol === "5" ? "5.0" : "3.1.1";
    client.on("connect", (connack) => {
      if (client !== ws.client) return;
      status.textContent = `Connected to ${values.url} as ${values.client_id}, MQTT ${version}${connack.sessionPresent ? ", session present" : ""}.`;
      renderSubscriptions();
    });
    client.on("message", (topic, payload, packet) => {
      ws.messages.unshift({ at: Date.now(), topic, qos: packet.qos, retain: packet.retain, payload: payloadText(payload) });
      ws.messages.length = Math.min(ws.messages.length, WS_MESSAGES);
      if (!$("#view-websocket").hidden) renderMessages();
    });
    client.on("error", (error) => {
      if (client !== ws.client) return;
      ws.refused = true;
      status.textContent = `Refused: ${error.message}`;
    });
    client.on("close", () => {
      if (client !== ws.client) return;
      connected(false);
      if (!ws.refused) status.textContent = "Disconnected.";
    });
  };
  $("#ws-disconnect").onclick = () => {
    if (ws.client) ws.client.end(false);
  };
  $("#ws-subscribe-form").onsubmit = (event) => {
    event.preventDefault();
    const { topic, qos } = formValues(event.target);
    ws.client.subscribe(topic, { qos: Number(qos) }, (error, granted) => {
      if (error) { report(error); return; }
      const [grant] = granted;
      if (grant.qos >= 0x80) {
        status.textContent = `SUBSCRIBE ${topic} refused: Reason Code 0x${grant.qos.toString(16)}.`;
        return;
      }
      ws.subscriptions.set(topic, grant.qos);
      renderSubscriptions();
    });
  };
  $("#ws-publish-form").onsubmit = (event) => {
    event.preventDefault();
    const { topic, qos, payload } = formValues(event.target);
    const retain = $("#ws-pub-retain").checked;
    ws.client.publish(topic, payload, { qos: Number(qos), retain }, (error) => {
      $("#ws-pub-message").textContent = error ? `Not published: ${error.message}` : `Published to ${topic}.`;
    });
  };
  $("#ws-messages-clear").onclick = () => { ws.messages = []; renderMessages(); };
  renderMessages();
  renderSubscriptions();
}

// ---------------------------------------------------------------- routing and login

function report(error) {
  if (error instanceof Unauthorized) {
    route();
    return;
  }
  console.error(error);
  const message = $("#session-message");
  alert(error.message);
  if (message) message.textContent = "";
}

const VIEWS = {
  overview: showOverview,
  sessions: showSessions,
  session: showSession,
  subscriptions: showSubscriptions,
  retained: showRetained,
  credentials: showCredentials,
  blocked: showBlocked,
  integrations: showIntegrations,
  audit: showAudit,
  users: showUsers,
  infrastructure: showInfrastructure,
  websocket: showWebSocket,
};

async function route() {
  timers.forEach(clearInterval);
  timers = [];
  const loggedIn = Boolean(sessionStorage.getItem(TOKEN));
  const [, name = "overview", ...rest] = location.hash.split("/");
  const view = loggedIn ? (VIEWS[name] ? name : "overview") : "login";
  document.querySelectorAll(".view").forEach((section) => {
    section.hidden = section.id !== `view-${view}`;
  });
  $("#nav").hidden = $("#who").hidden = !loggedIn;
  $("#username").textContent = sessionStorage.getItem(USER) || "";
  document.querySelectorAll("#nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.view === view || (view === "session" && a.dataset.view === "sessions"));
  });
  if (view === "login") {
    $("#login-username").focus();
    return;
  }
  try {
    await VIEWS[view](decodeURIComponent(rest.join("/")));
  } catch (error) {
    report(error);
  }
}

$("#login-form").onsubmit = async (event) => {
  event.preventDefault();
  $("#login-error").textContent = "";
  try {
    const { username, password } = formValues(event.target);
    const token = await api("/api/login", { method: "POST", body: { username, password } });
    sessionStorage.setItem(TOKEN, token.token);
    sessionStorage.setItem(USER, token.username);
    $("#login-password").value = "";
    route();
  } catch (error) {
    $("#login-error").textContent = error instanceof Unauthorized ? "Wrong user name or password." : error.message;
  }
};

$("#logout").onclick = async () => {
  try { await api("/api/logout", { method: "POST" }); } catch (error) { /* logged out anyway */ }
  sessionStorage.removeItem(TOKEN);
  route();
};

window.addEventListener("hashchange", route);
route();

// For the console's browser tests, which draw charts of their own series.
export { colour, lineChart, seriesName, when };
