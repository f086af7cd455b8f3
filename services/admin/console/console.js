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

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "–";
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

// ---------------------------------------------------------------- charts (SVG, no library)

const SVG = "http://www.w3.org/2000/svg";

function svg(name, attributes) {
  const element = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  return element;
}

// Draws series (arrays of [time ms, value]) as lines over a shared time axis.
function lineChart(element, series) {
  const width = element.clientWidth || 400;
  const height = element.clientHeight || 150;
  const left = 44, bottom = 18, top = 6, right = 8;
  const points = series.flat();
  const times = points.map(([t]) => t);
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const top_value = Math.max(1, ...points.map(([, v]) => v));
  const x = (t) => left + ((t - t0) / Math.max(1, t1 - t0)) * (width - left - right);
  const y = (v) => top + (1 - v / top_value) * (height - top - bottom);
  element.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const children = [];
  for (const fraction of [0, 0.5, 1]) {
    const value = top_value * fraction;
    children.push(svg("line", { class: "grid", x1: left, x2: width - right, y1: y(value), y2: y(value) }));
    const label = svg("text", { class: "axis", x: left - 6, y: y(value) + 3, "text-anchor": "end" });
    label.textContent = value >= 10 ? number.format(Math.round(value)) : decimal.format(value);
    children.push(label);
  }
  if (points.length) {
    const span = svg("text", { class: "axis", x: width - right, y: height - 4, "text-anchor": "end" });
    span.textContent = `last ${Math.round((t1 - t0) / 1000)} s`;
    children.push(span);
  }
  series.forEach((values, index) => {
    if (!values.length) return;
    const d = values.map(([t, v], i) => `${i ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    children.push(svg("path", { class: `line s${index % 4}`, d }));
  });
  element.replaceChildren(...children);
}

// ---------------------------------------------------------------- views

async function showOverview() {
  const refreshStats = async () => {
    const stats = await api("/api/stats");
    const current = stats.current;
    if (!current) return;
    $("#connections").textContent = number.format(current.connections);
    $("#msg-in").textContent = decimal.format(current.msg_in_per_second);
    $("#msg-out").textContent = decimal.format(current.msg_out_per_second);
    const lags = Object.values(current.lag);
    $("#lag-total").textContent = number.format(Math.round(lags.reduce((a, b) => a + b, 0)));
    const history = stats.history.map((s) => ({ ...s, t: Date.parse(s.at) }));
    lineChart($("#chart-connections"), [history.map((s) => [s.t, s.connections])]);
    // The first sample has no rate yet: it is left out of the rate chart.
    const rated = history.slice(1);
    lineChart($("#chart-rates"), [
      rated.map((s) => [s.t, s.msg_in_per_second]),
      rated.map((s) => [s.t, s.msg_out_per_second]),
    ]);
    const stages = [...new Set(history.flatMap((s) => Object.keys(s.lag)))].sort();
    lineChart($("#chart-lag"), stages.map((stage) => history.map((s) => [s.t, s.lag[stage] ?? 0])));
    $("#lag-legend").replaceChildren(
      ...stages.flatMap((stage, index) => {
        const swatch = document.createElement("i");
        swatch.className = `s${index % 4}`;
        return [swatch, document.createTextNode(stage)];
      }),
    );
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
    const facts = [
      ["State", s.connected ? "connected" : "disconnected"],
      ["Node", s.node_id],
      ["Client address", s.client_address ?? "unknown"],
      ["Connected since", when(s.connected_at)],
      ["Protocol", `MQTT ${s.protocol_version}`],
      ["Kind", s.kind],
      ["Persistent session", s.persistent ? "yes" : "no"],
      ["Session Expiry Interval", `${number.format(s.session_expiry_interval)} s`],
      ["Kept when disconnected", !s.persistent ? "no: it ends with its connection"
        : s.kept_seconds === null ? "for ever" : `${number.format(s.kept_seconds)} s`],
      ["Receive Maximum", number.format(s.receive_maximum)],
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

async function showCredentials() {
  const message = $("#credentials-message");
  let credentials = [];
  const editRules = () => {
    const chosen = credentials.find((c) => c.name === $("#credential-rules-name").value);
    $("#credential-rules-edit").value = chosen ? rulesText(chosen.rules) : "";
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
    const select = $("#credential-rules-name");
    const kept = select.value;
    select.replaceChildren(...credentials.map((c) => new Option(c.name, c.name, false, c.name === kept)));
    editRules();
  };
  $("#credential-rules-name").onchange = editRules;
  $("#credentials-add-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = formValues(event.target);
    try {
      const body = { name: values.name, type: values.type, kind: values.kind, rules: parseRules(values.rules) };
      if (values.username) body.username = values.username;
      if (values.client_id && values.type === "MQTT_BASIC") body.client_id = values.client_id;
      if (values.password) body.password = values.password;
      await api("/api/credentials", { method: "POST", body });
      event.target.reset();
      message.textContent = `${body.name} created: clients may connect with it.`;
      await load();
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

async function showAudit() {
  const load = async (offset = 0) => {
    const page = await api(`/api/audit${query({ offset, limit: PAGE })}`);
    fill("#audit", page.items.map((e) => row([
      cell(when(e.at)), cell(e.username), cell(e.action), cell(e.target),
      cell(e.status < 300 ? badge(String(e.status), "ok") : badge(String(e.status), "bad")),
    ])), "Nothing audited yet.");
    pager("#audit-pager", page, load);
  };
  await load();
}

async function showUsers() {
  const message = $("#users-message");
  const me = sessionStorage.getItem(USER);
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
  audit: showAudit,
  users: showUsers,
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
