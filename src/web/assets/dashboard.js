// envlens dashboard: the pages are complete without this script. It adds live updates (GraphQL
// subscriptions over graphql-transport-ws, SPEC 8.2: a resource's new health is applied in
// place; other changes re-render the page's live regions from the server), a fallback refresh
// while the socket is down, reconnecting by itself, and following a pod's logs.
"use strict";
(function () {
  const body = document.body;
  const status = document.getElementById("live");
  const csrf = (document.querySelector('meta[name="csrf-token"]') || {}).content || "";

  function say(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  // --- Re-rendering the live regions from the server -------------------------------------
  let inFlight = false, again = false;
  async function refresh() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    try {
      const res = await fetch(location.href, { headers: { "X-Envlens-Refresh": "1" }, credentials: "same-origin" });
      if (!res.ok) return;
      const doc = new DOMParser().parseFromString(await res.text(), "text/html");
      document.querySelectorAll("[data-live-region]").forEach(function (old) {
        const fresh = doc.getElementById(old.id);
        if (!fresh) return;
        const open = new Set();
        old.querySelectorAll("details[id]").forEach(function (d) { if (d.open) open.add(d.id); });
        const closed = new Set();
        old.querySelectorAll("details[id]").forEach(function (d) { if (!d.open) closed.add(d.id); });
        fresh.querySelectorAll("details[id]").forEach(function (d) {
          if (open.has(d.id)) d.open = true;
          if (closed.has(d.id)) d.open = false;
        });
        const focused = document.activeElement && document.activeElement.id;
        old.replaceWith(fresh);
        if (focused) { const f = document.getElementById(focused); if (f) f.focus(); }
      });
      body.dataset.refreshed = String(Date.now());
    } catch (e) {
      // The next message or poll tries again.
    } finally {
      inFlight = false;
      if (again) { again = false; refresh(); }
    }
  }

  // A page whose regions follow no subscription re-renders them every few seconds while it is
  // shown (an agent's page: its connection is read from memory, and announced by nothing).
  const every = document.querySelector("[data-refresh-every]");
  if (every) {
    setInterval(function () { if (!document.hidden) refresh(); }, 1000 * (Number(every.dataset.refreshEvery) || 10));
    say("live", "Refreshed every " + (Number(every.dataset.refreshEvery) || 10) + " s");
  }

  // --- Applying a message in place ---------------------------------------------------------
  // A resourceGroupUpdated message changes the health of resources the page shows (elements
  // with data-uid: a tree line, a graph node): those are updated here, at once. Anything the
  // page cannot redraw by itself (a resource added or removed, an edge, new events, the
  // group's warnings and errors) re-renders the live regions from the server instead.
  function healthClass(status) { return "h-" + (status ? status.toLowerCase() : "none"); }
  function healthWord(status) {
    if (!status) return "No health";
    const lower = status.toLowerCase();
    return lower.charAt(0).toUpperCase() + lower.slice(1);
  }
  function setBadge(badge, status) {
    if (!badge) return;
    badge.className = "badge " + healthClass(status);
    badge.textContent = healthWord(status);
  }
  function eventsMark(events) {
    let repeats = 0;
    (events || []).forEach(function (e) { repeats += e.count || 0; });
    return (events || []).length + ":" + repeats;
  }
  function showResource(el, r) {
    const status = r.health ? r.health.status : null;
    const message = r.health ? r.health.message : null;
    if (el.tagName.toLowerCase() === "a") {
      // A graph node: its health bar and its title.
      const bar = el.querySelector('rect[class^="hs-"]');
      if (bar) bar.setAttribute("class", "hs-" + healthClass(status).slice(2));
      const title = el.querySelector("title");
      if (title) {
        const name = title.textContent.split(":")[0].split(" (")[0];
        title.textContent = name + (status ? ": " + healthWord(status) : "") + (message ? " (" + message + ")" : "");
      }
      return;
    }
    setBadge(el.querySelector(".badge"), status);
    const msg = el.querySelector(":scope > .msg");
    if (msg) { msg.textContent = message || ""; msg.hidden = !message; }
  }
  // true when the page now shows what the message says; false when only the server can.
  function apply(update) {
    if (!update) return false;
    const shown = new Map();
    document.querySelectorAll("[data-uid]").forEach(function (el) {
      const list = shown.get(el.dataset.uid);
      if (list) list.push(el); else shown.set(el.dataset.uid, [el]);
    });
    const summary = document.getElementById("summary");
    let whole = shown.size > 0 && !!summary
      && summary.dataset.notes === String(update.warnings.length + update.errors.length);
    if (update.complete) {
      // The whole group: the same resources and as many edges as the page shows?
      whole = whole && update.upserted.length === shown.size
        && summary.dataset.edges === String(update.edgesAdded.length);
    } else {
      whole = whole && update.removed.length === 0 && update.edgesAdded.length === 0
        && update.edgesRemoved.length === 0;
    }
    update.upserted.forEach(function (r) {
      const els = shown.get(r.uid);
      if (!els) { whole = false; return; }
      els.forEach(function (el) {
        if (el.dataset.ev !== eventsMark(r.events)) whole = false;
        showResource(el, r);
      });
    });
    const group = document.getElementById("group-health");
    if (group) setBadge(group.querySelector(".badge"), update.health);
    const groupMessage = document.getElementById("group-health-message");
    if (groupMessage) { groupMessage.textContent = update.healthMessage || ""; groupMessage.hidden = !update.healthMessage; }
    if (whole) body.dataset.applied = String(Date.now());
    return whole;
  }

  // --- The timeline: an entry from environmentEventsUpdated, in place ----------------------
  function ago(time) {
    const s = Math.max(0, Math.round((Date.now() - Date.parse(time)) / 1000));
    if (s < 60) return s + " s ago";
    if (s < 3600) return Math.floor(s / 60) + " min ago";
    if (s < 86400) return Math.floor(s / 3600) + " h ago";
    const d = Math.floor(s / 86400);
    return d === 1 ? "1 day ago" : d + " days ago";
  }
  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function showEvent(e) {
    const list = document.querySelector("ol.timeline");
    if (!list) { refresh(); return; }
    const warning = e.type === "Warning";
    const li = el("li", warning ? "warning" : "normal");
    li.dataset.event = e.id;
    const head = el("div", "head");
    head.append(el("span", "badge " + (warning ? "h-degraded" : "h-none"), e.type), el("strong", "", e.reason));
    if (e.count > 1) head.append(el("span", "count", "×" + e.count));
    const time = el("time", "", ago(e.lastTime));
    time.setAttribute("datetime", e.lastTime);
    head.append(time);
    li.append(head);
    // The resource's kind and link, as the page shows them already.
    const node = e.resourceUid && document.querySelector('.node[data-uid="' + CSS.escape(e.resourceUid) + '"]');
    if (node && node.querySelector("a.name")) {
      const about = el("div", "about");
      const link = el("a", "", node.querySelector("a.name").textContent);
      link.href = node.querySelector("a.name").getAttribute("href");
      about.append(el("span", "kind", (node.querySelector(".kind") || {}).textContent || ""), " ", link);
      li.append(about);
    } else if (e.source === "ENVLENS") {
      const about = el("div", "about");
      about.append(el("span", "kind", "envlens"));
      li.append(about);
    }
    li.append(el("p", "msg", e.message));
    const old = list.querySelector('li[data-event="' + CSS.escape(e.id) + '"]');
    if (old) old.remove();
    const later = [...list.children].find(function (item) {
      const t = item.querySelector("time");
      return t && t.getAttribute("datetime") < e.lastTime;
    });
    list.insertBefore(li, later || null);
    body.dataset.timeline = String(Date.now());
  }

  // --- Subscriptions --------------------------------------------------------------------
  const query = body.dataset.subscription;
  const TIMELINE = "subscription($environmentId: ID!) { environmentEventsUpdated(environmentId: $environmentId) " +
    "{ id type reason message count lastTime resourceUid source } }";
  let variables = {};
  try { variables = JSON.parse(body.dataset.variables || "{}"); } catch (e) { variables = {}; }
  let delay = 1000, poll = null, socket = null, wasLive = false;

  function startPolling() {
    if (poll || !query) return;
    poll = setInterval(function () { if (!document.hidden) refresh(); }, 10000);
  }
  function stopPolling() { if (poll) { clearInterval(poll); poll = null; } }

  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/api/graphql";
    let acked = false;
    try {
      socket = new WebSocket(url, "graphql-transport-ws");
    } catch (e) { retry(); return; }
    socket.onopen = function () {
      socket.send(JSON.stringify({ type: "connection_init", payload: { "X-Csrf-Token": csrf } }));
    };
    socket.onmessage = function (event) {
      let msg;
      try { msg = JSON.parse(event.data); } catch (e) { return; }
      if (msg.type === "connection_ack") {
        acked = true; delay = 1000;
        socket.send(JSON.stringify({ id: "1", type: "subscribe", payload: { query: query, variables: variables } }));
        // The environment's timeline: a new entry re-renders its region from the server.
        if (document.querySelector("[data-timeline]") && variables.environmentId) {
          socket.send(JSON.stringify({ id: "2", type: "subscribe", payload: { query: TIMELINE, variables: { environmentId: variables.environmentId } } }));
        }
        say("live", wasLive ? "Live again" : "Live");
        wasLive = true;
        stopPolling();
      } else if (msg.type === "ping") {
        socket.send(JSON.stringify({ type: "pong" }));
      } else if (msg.type === "next" && msg.id === "1") {
        // The environment page's messages carry what changed; other pages' only say that
        // something did. The first message is the whole state (the page may be older).
        const data = msg.payload && msg.payload.data;
        if (!(data && data.resourceGroupUpdated && apply(data.resourceGroupUpdated))) refresh();
      } else if (msg.id === "2") {
        // The timeline's own: a new or continued entry is put in place; its end (a viewer who
        // may not follow it) leaves the rest of the page live.
        const data = msg.type === "next" && msg.payload && msg.payload.data;
        if (data && data.environmentEventsUpdated) showEvent(data.environmentEventsUpdated);
      } else if (msg.type === "error" || msg.type === "complete") {
        say("down", "Live updates ended; reload the page");
        socket.onclose = null;
        socket.close();
      }
    };
    socket.onclose = function () {
      // What changed while the socket was down comes with the next first message; until
      // then the regions are refreshed from the server.
      if (acked) refresh();
      retry();
    };
  }
  function retry() {
    const seconds = Math.round(delay / 1000);
    say("down", "Connection lost; reconnecting in " + seconds + " s (refreshing every 10 s meanwhile)");
    startPolling();
    setTimeout(connect, delay);
    delay = Math.min(delay * 2, 30000);
  }
  if (query && "WebSocket" in window) {
    say("down", "Connecting live updates…");
    connect();
  }

  // --- A pod's logs, followed --------------------------------------------------------------
  const logs = document.querySelector("pre.logs[data-follow]");
  if (logs) {
    const toggle = document.getElementById("follow");
    const state = document.getElementById("follow-state");
    let controller = null;
    const nearBottom = function () { return logs.scrollHeight - logs.scrollTop - logs.clientHeight < 40; };
    async function follow() {
      controller = new AbortController();
      if (toggle) toggle.textContent = "Stop following";
      if (state) state.textContent = "Following";
      logs.textContent = "";
      try {
        const res = await fetch(logs.dataset.follow, { signal: controller.signal, credentials: "same-origin" });
        if (!res.ok || !res.body) throw new Error(res.status);
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          const stick = nearBottom();
          logs.append(document.createTextNode(value));
          if (stick) logs.scrollTop = logs.scrollHeight;
          logs.dataset.lines = String((logs.textContent.match(/\n/g) || []).length);
        }
        if (state) state.textContent = "The log stream ended";
      } catch (e) {
        if (state && controller && !controller.signal.aborted) state.textContent = "The log stream broke off; press Follow to resume";
      }
      controller = null;
      if (toggle) toggle.textContent = "Follow";
    }
    if (toggle) {
      toggle.hidden = false;
      toggle.addEventListener("click", function () {
        if (controller) { controller.abort(); controller = null; toggle.textContent = "Follow"; if (state) state.textContent = "Paused"; }
        else follow();
      });
    }
    follow();
  }
})();
