// framepackd's web page: submit a job, watch it live (steps, decode progress, ETA, latent
// previews, the video growing section by section), the queue, the gallery of finished videos
// and the devices. Plain JS, no build step; it talks to the REST API of the same origin
// (supervisor/httpapi).
'use strict';

const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED']);

const state = {
  selected: '',     // job id in the live view
  source: null,     // EventSource of the selected job
  jobs: new Map(),  // id -> Job (as the API returns it)
  lastVideo: '',    // URL the <video> shows
  previewURL: '',   // object URL of the preview image
  gallery: '',      // ids the gallery shows, joined (re-rendered only when they change)
  galleryJobs: new Map(), // id -> Job of the gallery (finished jobs beyond the queue's page too)
};

// ---- API ------------------------------------------------------------------------------------

// APIError is a failed API call: the HTTP status, the gRPC status message and, for
// INVALID_ARGUMENT, the field violations of its BadRequest detail ({field, description}).
class APIError extends Error {
  constructor(status, message, violations) { super(message); this.status = status; this.violations = violations || []; }
}

function violationsOf(body) {
  const out = [];
  for (const d of (body && body.details) || []) {
    if (String(d['@type'] || '').endsWith('google.rpc.BadRequest')) out.push(...(d.fieldViolations || []));
  }
  return out;
}

async function api(path, opts = {}) {
  let resp;
  try {
    resp = await fetch(path, Object.assign({ credentials: 'same-origin' }, opts));
  } catch (e) {
    throw new APIError(0, `the server did not answer (${e.message})`);
  }
  const text = await resp.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = null; }
  if (resp.status === 401) { showAuth(); }
  if (!resp.ok) {
    throw new APIError(resp.status, (body && body.message) || `${resp.status} ${resp.statusText}`, violationsOf(body));
  }
  $('conn').textContent = 'connected';
  return body;
}

// Feature modules (features.js) hook in here: spec(spec) adds their fields to the spec a submit
// sends, parts(form) their files to its multipart body, submit(spec) may take a submission over
// (true when it did), settings(job) returns more [name, value] rows for the live view, reuse(job)
// fills their controls from a job ("use these settings").
const hooks = { spec: [], parts: [], submit: [], settings: [], reuse: [] };

const shortState = (s) => (s || '').replace(/^(JOB_STATE_|LANE_STATE_)/, '');
const seconds = (d) => (d ? parseFloat(d) : NaN); // protojson Duration: "12.5s"

function fmtDuration(s) {
  if (!isFinite(s)) return '';
  s = Math.max(0, Math.round(s));
  const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), r = s % 60;
  return h ? `${h}h ${m}m` : m ? `${m}m ${r}s` : `${r}s`;
}

function fmtBytes(n) {
  n = Number(n || 0);
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
}

function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// ---- auth -----------------------------------------------------------------------------------

function showAuth() { $('auth').hidden = false; $('conn').textContent = 'sign in needed'; }

$('auth-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('auth-error').textContent = '';
  try {
    await api('/v1/session', { method: 'POST', headers: { Authorization: 'Bearer ' + $('token').value.trim() } });
    $('auth').hidden = true;
    $('token').value = '';
    refreshJobs(); refreshDevices(); loadDefaults();
  } catch (e) { $('auth-error').textContent = e.message; }
});

// ---- submit ---------------------------------------------------------------------------------

function previewFile(inputId, imgId) {
  $(inputId).addEventListener('change', () => {
    const f = $(inputId).files[0];
    const img = $(imgId);
    if (img.src) URL.revokeObjectURL(img.src);
    if (f) { img.src = URL.createObjectURL(f); img.hidden = false; } else { img.hidden = true; }
  });
}
previewFile('image', 'image-preview');
previewFile('end-image', 'end-image-preview');

// parseLoras reads "path strength" lines (strength 1 when left out); a bad strength throws
// with the line number, so nothing is submitted with a typo in it.
function parseLoras(text) {
  const loras = [];
  text.split('\n').forEach((line, i) => {
    const t = line.trim();
    if (!t) return;
    const m = t.match(/^(.*\S)\s+(-?[0-9.]+)$/);
    const path = m ? m[1] : t;
    const strength = m ? Number(m[2]) : 1;
    if (!Number.isFinite(strength)) throw new Error(`LoRAs line ${i + 1}: strength ${m[2]} is not a number`);
    loras.push({ path, strength });
  });
  return loras;
}

function num(id) { return Number($(id).value); }

function specFromForm() {
  const spec = {
    prompt: $('prompt').value,
    negativePrompt: $('negative').value,
    totalSecondLength: num('seconds'),
    seed: String(Math.trunc(num('seed'))),
    steps: num('steps'),
    gs: num('gs'),
    cfg: num('cfg'),
    rs: num('rs'),
    gpuMemoryPreservationGb: num('gpumem'),
    mp4Crf: num('crf'),
    resolution: num('resolution'),
    latentWindowSize: num('window'),
  };
  if ($('lane').value) spec.lane = $('lane').value;
  if ($('variant').value && $('variant').value !== 'i2v') spec.variant = $('variant').value;
  const loras = parseLoras($('loras').value);
  if (loras.length) spec.loras = loras;
  if ($('end-image').files[0]) spec.endStrength = num('end-strength');
  // A feature's error is the form's, not the LoRA field's (the one error above).
  for (const f of hooks.spec) { try { f(spec); } catch (e) { e.form = true; throw e; } }
  return spec;
}

// ---- field errors ---------------------------------------------------------------------------

// FIELD_INPUT maps the server's field names (SubmitJobRequest paths) to the form's controls.
const FIELD_INPUT = {
  'image': 'image', 'spec.image_filename': 'image', 'spec.prompt': 'prompt', 'spec.negative_prompt': 'negative',
  'spec.total_second_length': 'seconds', 'spec.seed': 'seed', 'spec.steps': 'steps', 'spec.gs': 'gs', 'spec.cfg': 'cfg',
  'spec.rs': 'rs', 'spec.use_teacache': 'cache', 'spec.gpu_memory_preservation_gb': 'gpumem', 'spec.mp4_crf': 'crf',
  'spec.resolution': 'resolution', 'spec.buckets': 'resolution', 'spec.latent_window_size': 'window', 'spec.lane': 'lane',
  'spec.variant': 'variant', 'spec.end_image': 'end-image', 'spec.end_strength': 'end-strength', 'spec.loras': 'loras',
};

// inputFor is the control a field violation belongs to ("spec.loras[0].path" is the LoRAs'), or ''.
function inputFor(field) {
  for (let f = field; f;) {
    if (FIELD_INPUT[f]) return FIELD_INPUT[f];
    const up = f.replace(/(\[\d+\]|\.[^.[\]]*)$/, '');
    if (up === f) break;
    f = up;
  }
  return '';
}

function clearFieldErrors() {
  for (const e of document.querySelectorAll('#job-form .field-error')) e.remove();
}

// showFieldError puts msg under the control with id inputId (opening the "More" box it may be in).
function showFieldError(inputId, msg) {
  const input = $(inputId);
  const label = input.closest('label') || input.parentElement;
  let span = label.querySelector(`.field-error[data-error-for="${inputId}"]`);
  if (!span) {
    span = el('span', { class: 'field-error error', dataset: { errorFor: inputId }, role: 'alert' });
    label.append(span);
  }
  span.textContent = span.textContent ? span.textContent + '; ' + msg : msg;
  const box = input.closest('details');
  if (box) box.open = true;
}

// showSubmitError shows a failed submit: each field violation next to its control, the rest
// (and any error without violations) under the button.
function showSubmitError(e) {
  clearFieldErrors();
  const rest = [];
  for (const v of e.violations || []) {
    const id = inputFor(v.field || '');
    if (id) showFieldError(id, v.description || 'invalid');
    else rest.push(`${v.field}: ${v.description}`);
  }
  $('submit-error').textContent = !(e.violations || []).length ? e.message
    : rest.length ? 'invalid request: ' + rest.join('; ') : 'the server refused some settings: see the fields marked above';
}

$('job-form').addEventListener('input', (ev) => {
  const span = ev.target.closest('label') && ev.target.closest('label').querySelector('.field-error');
  if (span) span.remove();
});

$('job-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  $('submit-error').textContent = '';
  clearFieldErrors();
  let spec;
  try { spec = specFromForm(); } catch (e) {
    if (e.form) $('submit-error').textContent = e.message; else showFieldError('loras', e.message);
    return;
  }
  for (const f of hooks.submit) {
    try { if (await f(spec)) return; } catch (e) { $('submit-error').textContent = e.message; return; }
  }
  const file = $('image').files[0];
  if (!file) { $('submit-error').textContent = 'choose a start image'; return; }
  const form = new FormData();
  form.append('image', file, file.name);
  const end = $('end-image').files[0];
  if (end) form.append('end_image', end, end.name);
  for (const f of hooks.parts) f(form);
  form.append('spec', JSON.stringify(spec));
  $('submit').disabled = true;
  try {
    const resp = await api('/v1/jobs', { method: 'POST', body: form });
    state.jobs.set(resp.job.id, resp.job);
    renderJobs();
    select(resp.job.id);
  } catch (e) {
    showSubmitError(e);
  } finally {
    $('submit').disabled = false;
  }
});

// ---- live view ------------------------------------------------------------------------------

function select(id) {
  if (state.source) { state.source.close(); state.source = null; }
  state.selected = id;
  if (location.hash !== '#job=' + id) history.replaceState(null, '', '#job=' + encodeURIComponent(id));
  state.lastVideo = '';
  $('live-id').textContent = id;
  $('live-empty').hidden = true;
  $('live-body').hidden = false;
  $('failure').textContent = '';
  $('progress').value = 0;
  $('progress-text').textContent = '';
  delete $('progress-text').dataset.step;
  delete $('progress-text').dataset.decode;
  $('preview').hidden = true;
  $('preview-caption').textContent = '';
  const v = $('video');
  v.hidden = true; v.removeAttribute('src'); v.load();
  $('download').hidden = true;
  const job = state.jobs.get(id) || state.galleryJobs.get(id);
  if (job) showJob(job);
  renderJobs();
  watch(id);
}

function watch(id) {
  const es = new EventSource(`/v1/jobs/${encodeURIComponent(id)}/events?previews=true`);
  state.source = es;
  const on = (kind, fn) => es.addEventListener(kind, (m) => {
    if (state.source !== es) return;
    let ev;
    try { ev = JSON.parse(m.data); } catch (_) { return; }
    fn(ev);
  });
  on('snapshot', (ev) => { state.jobs.set(id, ev.snapshot); showJob(ev.snapshot); renderJobs(); });
  on('stageStarted', (ev) => {
    const was = state.jobs.get(id);
    if (!ev.replay && was && shortState(was.state) === 'QUEUED') refreshDevices(); // the lane took it
    setState(id, 'JOB_STATE_RUNNING');
    stageText(ev.stageStarted);
  });
  on('samplingStep', (ev) => stepProgress(id, ev.samplingStep));
  on('stageProgress', (ev) => stageProgress(id, ev.stageProgress));
  on('preview', (ev) => showPreview(ev.preview));
  on('sectionVideo', (ev) => showVideo(`/v1/jobs/${encodeURIComponent(id)}/sections/${ev.sectionVideo.sectionIndex || 0}/video`, false));
  on('retry', (ev) => { $('progress-text').textContent = `retrying ${stageName(ev.retry.attempt.stage)}: ${ev.retry.attempt.message || ''}`; });
  // A job that ends frees its lane: the devices panel and the gallery follow at once.
  const ended = () => { es.close(); refreshOne(id); refreshDevices(); refreshGallery(); };
  on('jobFinished', ended);
  on('jobFailed', (ev) => { $('failure').textContent = (ev.jobFailed.failure || {}).message || 'failed'; ended(); });
  on('jobCancelled', ended);
  on('error', (ev) => { if (ev && ev.message) $('failure').textContent = ev.message; es.close(); });
  es.onerror = () => {
    // The server ended the stream (daemon stopping) or the network dropped: poll the job.
    if (es.readyState === EventSource.CLOSED && state.source === es) refreshOne(id);
  };
}

function stageName(s) { return (s || '').replace(/^STAGE_/, '').toLowerCase().replace(/_/g, ' '); }

function stageText(st) {
  const job = state.jobs.get(state.selected);
  const total = job && job.progress ? job.progress.totalSections : 0;
  const sec = st.sectionIndex || 0;
  $('progress-text').textContent = `${stageName(st.stage)}` + (total ? ` · section ${sec + 1} of ${total}` : '');
}

function stepProgress(id, s) {
  const job = state.jobs.get(id);
  const totalSections = (job && job.progress && job.progress.totalSections) || 1;
  const sec = s.sectionIndex || 0;
  const frac = s.fraction || (sec + (s.step || 0) / (s.totalSteps || 1)) / totalSections;
  $('progress').value = Math.max($('progress').value, Math.min(1, frac));
  const eta = seconds(s.eta);
  $('progress-text').textContent =
    `step ${s.step} of ${s.totalSteps} · section ${sec + 1} of ${totalSections}` +
    (isFinite(eta) ? ` · about ${fmtDuration(eta)} left` : '') +
    (s.stepDuration ? ` · ${seconds(s.stepDuration).toFixed(2)} s/step` : '');
  $('progress-text').dataset.step = String(s.step);
}

// stageProgress shows a stage's progress in model runs (the VAE decode's tiles and chunks of
// frames), with the job's ETA and share done.
function stageProgress(id, p) {
  const job = state.jobs.get(id);
  const totalSections = (job && job.progress && job.progress.totalSections) || 1;
  const sec = p.sectionIndex || 0;
  if (p.fraction) $('progress').value = Math.max($('progress').value, Math.min(1, p.fraction));
  const eta = seconds(p.eta);
  $('progress-text').textContent =
    `${stageName(p.stage)} ${p.done || 0} of ${p.total || 0}` + (totalSections > 1 || sec ? ` · section ${sec + 1} of ${totalSections}` : '') +
    (isFinite(eta) ? ` · about ${fmtDuration(eta)} left` : '');
  $('progress-text').dataset.decode = `${p.done || 0}/${p.total || 0}`;
}

function showPreview(p) {
  const bin = atob(p.png || '');
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
  const url = URL.createObjectURL(new Blob([bytes], { type: 'image/png' }));
  const img = $('preview');
  img.onload = () => { if (state.previewURL && state.previewURL !== url) URL.revokeObjectURL(state.previewURL); state.previewURL = url; };
  img.src = url;
  img.hidden = false;
  $('preview-caption').textContent = `latent preview · section ${(p.sectionIndex || 0) + 1}, step ${p.step}`;
}

function showVideo(url, final) {
  if (state.lastVideo === url) return;
  state.lastVideo = url;
  const v = $('video');
  v.dataset.final = final ? 'true' : 'false';
  v.src = url;
  v.hidden = false;
  v.play().catch(() => {});
  const a = $('download');
  a.href = url + '?download=true';
  a.textContent = final ? 'Download MP4' : 'Download the video so far';
  a.hidden = false;
}

function setState(id, st) {
  const job = state.jobs.get(id);
  if (job && job.state !== st && !TERMINAL.has(shortState(job.state))) { job.state = st; renderJobs(); showJob(job); }
}

function showJob(job) {
  if (job.id !== state.selected) return;
  const st = shortState(job.state);
  const badge = $('live-state');
  badge.textContent = st.toLowerCase();
  badge.className = 'state ' + st;
  badge.dataset.state = st;
  badge.hidden = !st;
  $('live-cancel').hidden = !st || TERMINAL.has(st);
  $('live-delete').hidden = !TERMINAL.has(st);
  if (st === 'SUCCEEDED') {
    $('progress').value = 1;
    $('progress-text').textContent = `done · ${job.result && job.result.frameCount} frames in ${fmtDuration(seconds(job.result && job.result.duration))}`;
    showVideo(`/v1/jobs/${encodeURIComponent(job.id)}/video`, true);
  } else if (st === 'FAILED') {
    $('failure').textContent = (job.failure && job.failure.message) || 'failed';
  } else if (st === 'CANCELLED') {
    $('progress-text').textContent = 'cancelled';
  } else if (job.progress && job.progress.latestVideoPath && !state.lastVideo) {
    // The newest section MP4 written (section-NNN.mp4), when the page opens mid-job.
    const m = /section-(\d+)\.mp4$/.exec(job.progress.latestVideoPath);
    if (m) showVideo(`/v1/jobs/${encodeURIComponent(job.id)}/sections/${Number(m[1])}/video`, false);
  }
  const dl = $('settings');
  dl.replaceChildren();
  for (const [k, v] of [...settingsRows(job), ...hooks.settings.flatMap((f) => f(job))]) {
    if (v === undefined || v === '') continue;
    dl.append(el('dt', { textContent: k }), el('dd', { textContent: String(v), dataset: { setting: k } }));
  }
}

// settingsRows lists every setting of a job, as the spec holds it (protojson leaves zero
// values out: their defaults are spelled here).
function settingsRows(job) {
  const s = job.spec || {};
  const applied = new Map(((job.lorasApplied) || []).map((l) => [l.path, l]));
  const loras = (s.loras || []).map((l) => {
    const a = applied.get(l.path);
    return `${l.path} × ${l.strength || 1}` + (a ? ` (${a.format}, ${a.weightsChanged || 0} weights changed)` : '');
  }).join('\n');
  const end = s.endImageSha256;
  return [
    ['prompt', s.prompt], ['negative prompt', s.negativePrompt], ['variant', s.variant || 'i2v'], ['seconds', s.totalSecondLength],
    ['seed', s.seed || '0'], ['steps', s.steps], ['distilled CFG', s.gs], ['CFG', s.cfg], ['CFG rescale', s.rs || 0],
    ['TeaCache', s.useTeacache === false ? 'off' : 'on'], ['GPU memory kept free', `${s.gpuMemoryPreservationGb || 0} GB`],
    ['MP4 CRF', s.mp4Crf || 0], ['resolution', s.resolution],
    ['buckets', (s.buckets || []).map((b) => `${b.height}×${b.width}`).join(', ')], ['latent window', s.latentWindowSize],
    ['LoRAs', loras || 'none'], ['end image', end ? `sha256 ${end.slice(0, 16)}…` : 'none'],
    ['end strength', end ? (s.endStrength === undefined ? 1 : s.endStrength) : undefined],
    ['image', s.imageFilename], ['lane', job.lane || s.lane || 'any'], ['submitted', job.createTime],
  ];
}

async function refreshOne(id) {
  try {
    const r = await api(`/v1/jobs/${encodeURIComponent(id)}`);
    state.jobs.set(id, r.job);
    showJob(r.job);
    renderJobs();
  } catch (_) { /* shown by the next refresh */ }
}

// ---- queue ----------------------------------------------------------------------------------

async function refreshJobs() {
  try {
    const r = await api('/v1/jobs?page_size=50');
    const seen = new Set();
    for (const j of (r && r.jobs) || []) {
      seen.add(j.id);
      const old = state.jobs.get(j.id);
      // The live stream may be ahead of the store's last progress; keep the newer state.
      if (!old || TERMINAL.has(shortState(j.state)) || shortState(old.state) === 'QUEUED') state.jobs.set(j.id, j);
      else state.jobs.set(j.id, Object.assign(j, { state: TERMINAL.has(shortState(old.state)) ? old.state : j.state }));
    }
    for (const id of [...state.jobs.keys()]) if (!seen.has(id)) state.jobs.delete(id);
    renderJobs();
    const done = [...state.jobs.values()].filter((j) => shortState(j.state) === 'SUCCEEDED').map((j) => j.id);
    if (done.some((id) => !state.gallery.split(' ').includes(id))) refreshGallery();
    const sel = state.jobs.get(state.selected);
    if (sel) showJob(sel);
  } catch (e) {
    if (e.status !== 401) $('conn').textContent = 'not connected: ' + e.message;
  }
}

function renderJobs() {
  const tbody = $('jobs');
  tbody.replaceChildren();
  const jobs = [...state.jobs.values()].sort((a, b) => (b.createTime || '').localeCompare(a.createTime || ''));
  for (const j of jobs) {
    const st = shortState(j.state);
    const p = j.progress || {};
    const prog = st === 'SUCCEEDED' ? '100%' : p.fraction ? `${Math.round(p.fraction * 100)}%` : '';
    const actions = el('td');
    if (!TERMINAL.has(st)) {
      actions.append(el('button', { class: 'small secondary cancel', type: 'button', textContent: 'Cancel', dataset: { id: j.id },
        onclick: (ev) => { ev.stopPropagation(); cancel(j.id); } }));
    } else {
      if (st === 'SUCCEEDED') {
        actions.append(el('a', { href: `/v1/jobs/${encodeURIComponent(j.id)}/video?download=true`, textContent: 'Download', onclick: (ev) => ev.stopPropagation() }), ' ');
      }
      actions.append(el('button', { class: 'small secondary delete', type: 'button', textContent: 'Delete', dataset: { id: j.id },
        onclick: (ev) => { ev.stopPropagation(); deleteJob(j.id); } }));
    }
    const tr = el('tr', { class: j.id === state.selected ? 'selected' : '', dataset: { id: j.id, state: st }, onclick: () => select(j.id) },
      el('td', { class: 'mono', textContent: j.id }),
      el('td', {}, el('span', { class: 'state ' + st, textContent: st.toLowerCase() })),
      el('td', { textContent: prog }),
      el('td', { class: 'prompt', textContent: (j.spec && j.spec.prompt) || '', title: (j.spec && j.spec.prompt) || '' }),
      actions);
    tbody.append(tr);
  }
}

async function cancel(id) {
  try {
    const r = await api(`/v1/jobs/${encodeURIComponent(id)}:cancel`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ reason: 'cancelled from the web page' }),
    });
    state.jobs.set(id, r.job);
    renderJobs();
    showJob(r.job);
  } catch (e) { alert(e.message); }
}

// deleteJob deletes a finished job with its files on the server (DeleteJob), after asking.
async function deleteJob(id) {
  if (!confirm(`Delete job ${id} and its video from the server?`)) return;
  try {
    await api(`/v1/jobs/${encodeURIComponent(id)}`, { method: 'DELETE' });
  } catch (e) {
    if (e.status !== 404) { alert(e.message); return; }
  }
  state.jobs.delete(id);
  if (state.selected === id) clearLive();
  renderJobs();
  refreshGallery();
}

// clearLive empties the live view (its job was deleted).
function clearLive() {
  if (state.source) { state.source.close(); state.source = null; }
  state.selected = '';
  state.lastVideo = '';
  history.replaceState(null, '', location.pathname);
  $('live-id').textContent = '';
  $('live-state').hidden = true;
  $('live-empty').hidden = false;
  $('live-body').hidden = true;
  const v = $('video');
  v.removeAttribute('src'); v.load();
}

$('live-cancel').addEventListener('click', () => { if (state.selected) cancel(state.selected); });
$('live-delete').addEventListener('click', () => { if (state.selected) deleteJob(state.selected); });
$('live-reuse').addEventListener('click', () => {
  const j = state.jobs.get(state.selected) || state.galleryJobs.get(state.selected);
  if (j) reuse(j);
});

// ---- re-use a job's settings ------------------------------------------------------------------

// fileFrom fetches one of a job's images (/image, /end-image) as a File for an <input type=file>.
async function fileFrom(url, name) {
  const resp = await fetch(url, { credentials: 'same-origin' });
  if (!resp.ok) throw new Error(`${url}: ${resp.status} ${resp.statusText}`);
  const blob = await resp.blob();
  return new File([blob], name, { type: blob.type });
}

function setFile(inputId, file) {
  const dt = new DataTransfer();
  if (file) dt.items.add(file);
  $(inputId).files = dt.files;
  $(inputId).dispatchEvent(new Event('change'));
}

// reuse fills the form with a job's settings and images ("use these settings"), as
// FramePack-Studio's outputs view does, ready to submit as a new job.
async function reuse(job) {
  const s = job.spec || {};
  const set = (id, v) => { if (v !== undefined) $(id).value = String(v); };
  set('prompt', s.prompt || '');
  set('negative', s.negativePrompt || '');
  set('seconds', s.totalSecondLength);
  set('seed', s.seed || '0');
  set('steps', s.steps);
  set('gs', s.gs);
  set('cfg', s.cfg);
  set('rs', s.rs || 0);
  set('gpumem', s.gpuMemoryPreservationGb || 0);
  set('crf', s.mp4Crf || 0);
  set('window', s.latentWindowSize);
  set('end-strength', s.endStrength === undefined ? 1 : s.endStrength);
  for (const f of hooks.reuse) f(job);
  const pick = (id, v) => { if ([...$(id).options].some((o) => o.value === v)) $(id).value = v; };
  pick('resolution', String(s.resolution || 640));
  pick('variant', s.variant || 'i2v');
  pick('lane', s.lane || '');
  $('loras').value = (s.loras || []).map((l) => `${l.path} ${l.strength || 1}`).join('\n');
  clearFieldErrors();
  $('submit-error').textContent = '';
  $('job-form').dataset.reusedFrom = '';
  $('new').scrollIntoView({ behavior: 'smooth', block: 'start' });
  const base = `/v1/jobs/${encodeURIComponent(job.id)}`;
  try {
    setFile('image', await fileFrom(base + '/image', s.imageFilename || 'start.png'));
    setFile('end-image', s.endImageSha256 ? await fileFrom(base + '/end-image', 'end.png') : null);
  } catch (e) {
    $('submit-error').textContent = `the job's images could not be loaded: ${e.message}`;
    return;
  }
  $('job-form').dataset.reusedFrom = job.id;
}

// ---- gallery ----------------------------------------------------------------------------------

// refreshGallery lists the finished videos, newest first: thumbnail, prompt, settings, and
// buttons to open one or re-use its settings.
async function refreshGallery() {
  let r;
  try { r = await api('/v1/jobs?states=JOB_STATE_SUCCEEDED&page_size=60'); } catch (_) { return; }
  const jobs = (r && r.jobs) || [];
  const key = jobs.map((j) => j.id).join(' ');
  state.galleryJobs = new Map(jobs.map((j) => [j.id, j]));
  if (key === state.gallery) return;
  state.gallery = key;
  const box = $('gallery-items');
  box.replaceChildren();
  $('gallery-empty').hidden = jobs.length > 0;
  for (const j of jobs) {
    const s = j.spec || {};
    const base = `/v1/jobs/${encodeURIComponent(j.id)}`;
    const img = el('img', { class: 'thumb', alt: `thumbnail of job ${j.id}`, loading: 'lazy', src: base + '/thumbnail' });
    // A job finished before thumbnails were written shows its start image.
    img.addEventListener('error', () => { if (!img.dataset.fallback) { img.dataset.fallback = 'true'; img.src = base + '/image'; } });
    const meta = [`${s.totalSecondLength} s`, `seed ${s.seed || 0}`, `${s.steps} steps`, s.variant || 'i2v',
      `${(j.result && j.result.frameCount) || 0} frames`].join(' · ');
    box.append(el('figure', { class: 'card', dataset: { id: j.id } },
      el('button', { class: 'thumb-button', type: 'button', title: 'open', onclick: () => select(j.id) }, img),
      el('figcaption', {},
        el('p', { class: 'card-prompt', textContent: s.prompt || '', title: s.prompt || '' }),
        el('p', { class: 'muted card-meta', textContent: meta }),
        el('div', { class: 'actions' },
          el('button', { class: 'small secondary reuse', type: 'button', textContent: 'Use these settings', onclick: () => reuse(j) }),
          el('a', { href: base + '/video?download=true', textContent: 'Download' })))));
  }
}

// ---- devices --------------------------------------------------------------------------------

// refreshDevices redraws the devices panel; when the daemon does not answer, every device
// shows as unreachable instead of its last state.
async function refreshDevices() {
  let r;
  try { r = await api('/v1/devices'); } catch (e) {
    if (e.status === 401) return;
    $('conn').textContent = 'not connected: ' + e.message;
    for (const div of $('devices').querySelectorAll('.device')) {
      div.dataset.state = 'UNREACHABLE';
      const badge = div.querySelector('.state');
      badge.className = 'state UNREACHABLE';
      badge.textContent = 'unreachable';
      for (const x of div.querySelectorAll('.reason, .running')) x.remove();
      div.append(el('div', { class: 'error reason', textContent: 'the daemon did not answer: ' + e.message }));
    }
    return;
  }
  const box = $('devices');
  box.replaceChildren();
  const lanes = $('lane');
  const chosen = lanes.value;
  lanes.replaceChildren(el('option', { value: '', textContent: 'any' }));
  for (const d of (r && r.devices) || []) {
    const st = shortState(d.laneState);
    const total = Number(d.totalMemoryBytes || 0), used = Number(d.usedMemoryBytes || 0);
    const div = el('div', { class: 'device', dataset: { lane: d.lane, state: st } },
      el('div', {}, el('strong', { textContent: d.lane }), ' ', el('span', { class: 'state ' + st, textContent: st.toLowerCase() }),
        ' ', el('span', { class: 'muted', textContent: [d.name, d.arch, d.backend].filter(Boolean).join(' · ') })));
    if (total > 0) {
      div.append(el('meter', { min: 0, max: total, value: used, high: total * 0.9, title: 'memory in use' }),
        el('div', { class: 'muted', textContent: `memory ${fmtBytes(used)} of ${fmtBytes(total)}` }));
    }
    if (d.laneStateReason) div.append(el('div', { class: (st === 'HEALTHY' ? 'muted' : 'error') + ' reason', textContent: d.laneStateReason }));
    if (d.currentJobId) div.append(el('div', { class: 'muted running', textContent: 'running ' + d.currentJobId, dataset: { job: d.currentJobId } }));
    box.append(div);
    lanes.append(el('option', { value: d.lane, textContent: d.lane }));
  }
  lanes.value = chosen;
}

// ---- defaults -------------------------------------------------------------------------------

// loadDefaults selects the served models' resolution (640 on FramePack's models, 96 on the tiny
// test models) and disables the tables they do not take, saying why.
async function loadDefaults() {
  let r;
  try { r = await api('/v1/jobs:defaults'); } catch (_) { return; }
  const sel = $('resolution');
  for (const o of (r && r.resolutions) || []) {
    const opt = sel.querySelector(`option[value="${o.resolution}"]`);
    if (opt) { opt.disabled = !!o.unavailableReason; opt.title = o.unavailableReason || ''; }
  }
  if (r && r.spec && r.spec.resolution) sel.value = String(r.spec.resolution);
}

// ---- start ----------------------------------------------------------------------------------

refreshJobs();
refreshDevices();
refreshGallery();
loadDefaults();
{
  const m = /^#job=([0-9a-z]+)$/.exec(location.hash);
  if (m) select(m[1]);
}
setInterval(refreshJobs, 3000);
setInterval(refreshDevices, 3000);
