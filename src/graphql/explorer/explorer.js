// envlens' GraphQL explorer: plain JavaScript, served by envlens itself. It talks to this
// envlens only (`/api/graphql`), and the page's Content-Security-Policy (connect-src 'self')
// holds it to that.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const saved = ['query', 'variables', 'operation', 'token', 'csrf'];
  // The tab's session storage keeps the editor and the token across reloads, not beyond.
  for (const id of saved) {
    const value = sessionStorage.getItem('envlens.' + id);
    if (value !== null) $(id).value = value;
    $(id).addEventListener('input', () => sessionStorage.setItem('envlens.' + id, $(id).value));
  }

  async function run() {
    const status = $('status');
    let variables = {};
    const text = $('variables').value.trim();
    if (text) {
      try {
        variables = JSON.parse(text);
      } catch (e) {
        status.textContent = 'Variables are not JSON: ' + e.message;
        return;
      }
    }
    const headers = { 'Content-Type': 'application/json', Accept: 'application/json' };
    const token = $('token').value.trim().replace(/^Bearer\s+/i, '');
    if (token) headers.Authorization = 'Bearer ' + token;
    const csrf = $('csrf').value.trim();
    if (csrf) headers['X-Csrf-Token'] = csrf;
    const body = { query: $('query').value, variables };
    const operation = $('operation').value.trim();
    if (operation) body.operationName = operation;

    $('run').disabled = true;
    status.textContent = 'Running…';
    const started = performance.now();
    try {
      const res = await fetch('/api/graphql', {
        method: 'POST',
        headers,
        body: JSON.stringify(body),
        credentials: 'same-origin',
      });
      const raw = await res.text();
      let shown = raw;
      try {
        shown = JSON.stringify(JSON.parse(raw), null, 2);
      } catch (_) {
        // not JSON: shown as it came
      }
      $('result').textContent = shown;
      const ms = Math.round(performance.now() - started);
      status.textContent = `${res.status} ${res.statusText} in ${ms} ms`;
    } catch (e) {
      status.textContent = 'Request failed: ' + e.message;
    } finally {
      $('run').disabled = false;
    }
  }

  $('run').addEventListener('click', run);
  document.addEventListener('keydown', (e) => {
    if ((e.ctrlKey || e.metaKey) && e.key === 'Enter') {
      e.preventDefault();
      run();
    }
  });

  // The schema, one definition per block; the filter keeps the blocks that mention it.
  const sdl = $('schema').textContent;
  const blocks = sdl.split(/\n(?=\S)/).reduce((acc, line) => {
    if (acc.length && !/^(type|input|enum|interface|union|scalar|schema|directive|"""|extend)\b/.test(line)) {
      acc[acc.length - 1] += '\n' + line;
    } else {
      acc.push(line);
    }
    return acc;
  }, []);
  $('filter').addEventListener('input', () => {
    const needle = $('filter').value.trim().toLowerCase();
    $('schema').textContent = needle
      ? blocks.filter((b) => b.toLowerCase().includes(needle)).join('\n')
      : sdl;
  });
})();
