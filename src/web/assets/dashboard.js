// envlens dashboard: the pages are complete without this script. It adds live updates (GraphQL
// subscriptions over graphql-transport-ws, SPEC 8.2: a message re-renders the page's live
// regions from the server), a fallback refresh while they are unavailable, and following a
// pod's logs.
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

  // --- Subscriptions --------------------------------------------------------------------
  const query = body.dataset.subscription;
  let variables = {};
  try { variables = JSON.parse(body.dataset.variables || "{}"); } catch (e) { variables = {}; }
  let delay = 1000, poll = null, socket = null;

  function startPolling() {
    if (poll || !query) return;
    poll = setInterval(function () { if (!document.hidden) refresh(); }, 10000);
  }
  function stopPolling() { if (poll) { clearInterval(poll); poll = null; } }

  function connect() {
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/api/graphql";
    let acked = false, first = true;
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
        say("live", "Live");
        stopPolling();
      } else if (msg.type === "ping") {
        socket.send(JSON.stringify({ type: "pong" }));
      } else if (msg.type === "next" && msg.id === "1") {
        // The first message is the whole state the page was rendered from (or newer).
        if (first) { first = false; refresh(); return; }
        refresh();
      } else if (msg.type === "error" || msg.type === "complete") {
        say("down", "Live updates ended; reload the page");
        socket.close();
      }
    };
    socket.onclose = function () {
      if (acked) refresh();
      retry();
    };
  }
  function retry() {
    const seconds = Math.round(delay / 1000);
    say("down", "Live updates unavailable; retrying in " + seconds + " s, refreshing every 10 s");
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
