"""The scripts of the deployment pages (plain JavaScript, no build step, no external assets).

Each page gets one ``<script>`` (its nonce is the only one its CSP allows): ``const page =
{...}`` with what the server knows (``markup.script_data``), then the code below.
Every action is a ``fetch`` to the REST API with the page's CSRF token in ``X-CSRF-Token``
(``auth.csrf_token``); its answer or error is shown in ``#message``.

The deployment page follows its deployment by long poll (``?wait=&after=<version>``) and
reloads when the progress changed. A poll that fails — the hub restarting, the network away, a
5xx — is tried again after a growing pause (``RETRY_FIRST_MS`` doubling up to ``RETRY_MAX_MS``)
for as long as the page is open; only a 4xx (signed out, deployment gone) ends the refresh, and
says so. The hub's version counter starts anew above the old one after a restart
(``changes.py``), so the first answer of the new process is already "changed".
"""

from __future__ import annotations

from typing import Any

from edgeagent.hub.server.dashboard.markup import script_data

RETRY_FIRST_MS = 250  # first pause after a failed poll
RETRY_MAX_MS = 5000  # the longest pause between two tries while the hub is away
POLL_WAIT_S = 25  # how long one long poll asks the hub to hold the answer

COMMON = """
const say = (text, bad) => {
  const m = document.getElementById('message');
  m.textContent = text; m.className = bad ? 'bad' : 'ok';
};
async function post(path, body) {
  const headers = {'X-CSRF-Token': page.csrf};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let r;
  try {
    r = await fetch(path, {method: 'POST', headers,
                           body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) { say(`the hub did not answer: ${e}`, true); return null; }
  const answer = await r.json().catch(() => ({error: `HTTP ${r.status}`}));
  if (!r.ok) { say(answer.error || `HTTP ${r.status}`, true); return null; }
  return answer;
}
const open = (id) => { location.assign(`/ui/deployments/${encodeURIComponent(id)}`); };
const on = (selector, handler) => {
  for (const b of document.querySelectorAll(selector)) b.addEventListener('click', handler);
};
"""

DEPLOYMENT = """
const base = `/api/v1/deployments/${encodeURIComponent(page.id)}`;
const progress = (d) => JSON.stringify([d.state, d.stage, d.totals]);
const pause = (ms) => new Promise((done) => setTimeout(done, ms));
async function follow() {
  let seen = page.seen, delay = 0;
  for (;;) {
    if (delay) await pause(delay);
    let r = null, d = null;
    try {
      r = await fetch(`${base}?wait=${page.wait}&after=${seen}&limit=1`, {cache: 'no-store'});
      if (r.ok) d = await r.json();
    } catch (e) { d = null; }
    if (d) {
      if (delay) say('');
      delay = 0; seen = d.version;
      if (progress(d) !== page.shown) { location.reload(); return; }
      continue;
    }
    if (r && r.status >= 400 && r.status < 500 && r.status !== 408 && r.status !== 429) {
      say(`live refresh stopped (HTTP ${r.status}): reload the page`, true); return;
    }
    delay = Math.min(delay ? delay * 2 : page.retry_first_ms, page.retry_max_ms);
    say('the hub is not answering; trying again…', true);
  }
}
on('button[data-action]', async (e) => {
  if (await post(`${base}/${e.currentTarget.dataset.action}`) !== null) location.reload();
});
on('#rollback', async () => {
  const version = document.getElementById('rollback-version').value;
  const made = await post(`${base}/rollback`, {version});
  if (made !== null) open(made.id);
});
on('#retry', async () => {
  const made = await post('/api/v1/deployments', page.retry);
  if (made !== null) open(made.id);
});
if (page.live) follow();
"""

CREATE = """
const field = (name) => document.getElementById(`new-${name}`).value.trim();
const numbers = (text) => text.split(/[\\s,]+/).filter((s) => s).map(Number);
on('#create', async () => {
  const body = {release_id: Number(field('release'))};
  const group = field('group'), devices = field('devices').split(/[\\s,]+/).filter((s) => s);
  if (group) body.group = group;
  if (devices.length) body.devices = devices;
  if (field('stages')) body.stages_pct = numbers(field('stages'));
  for (const [key, name] of [['abort_threshold_pct', 'threshold'], ['min_executed', 'min'],
                             ['stage_timeout_s', 'timeout']]) {
    if (field(name)) body[key] = Number(field(name));
  }
  const made = await post('/api/v1/deployments', body);
  if (made !== null) open(made.id);
});
"""


def page_script(data: dict[str, Any], code: str) -> str:
    """One page's script: its data, the shared helpers, its code."""
    settings = {"retry_first_ms": RETRY_FIRST_MS, "retry_max_ms": RETRY_MAX_MS, "wait": POLL_WAIT_S}
    return f"const page = {script_data({**settings, **data})};\n{COMMON}{code}"
