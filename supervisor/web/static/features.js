// framepackd's web page, the features of issue 33: the step cache (TeaCache, MagCache or none).
// It hooks into app.js through `hooks` (loaded before this file).
'use strict';

// ---- step cache -----------------------------------------------------------------------------

function showMagCache() {
  const on = $('cache').value === 'magcache';
  for (const l of document.querySelectorAll('#cache-box .magcache')) l.hidden = !on;
}
$('cache').addEventListener('change', showMagCache);
showMagCache();

hooks.spec.push((spec) => {
  spec.cache = $('cache').value;
  if (spec.cache === 'magcache') {
    spec.magcacheThreshold = num('magcache-threshold');
    spec.magcacheMaxConsecutiveSkips = num('magcache-max-skips');
    spec.magcacheRetentionRatio = num('magcache-retention');
  }
});

// The server's field names of these controls, for its refusals (app.js marks the field).
Object.assign(FIELD_INPUT, {
  'spec.cache': 'cache', 'spec.magcache_threshold': 'magcache-threshold',
  'spec.magcache_max_consecutive_skips': 'magcache-max-skips', 'spec.magcache_retention_ratio': 'magcache-retention',
});

// "Use these settings" sets the step cache as the job had it.
hooks.reuse.push((job) => {
  const s = job.spec || {};
  $('cache').value = s.cache || (s.useTeacache === false ? 'none' : 'teacache');
  for (const [k, id] of [['magcacheThreshold', 'magcache-threshold'], ['magcacheMaxConsecutiveSkips', 'magcache-max-skips'],
    ['magcacheRetentionRatio', 'magcache-retention']]) {
    if (s[k] !== undefined) $(id).value = String(s[k]);
  }
  showMagCache();
});

hooks.settings.push((job) => {
  const s = job.spec || {};
  const cache = s.cache || (s.useTeacache === false ? 'none' : 'teacache');
  const rows = [['step cache', cache]];
  if (cache === 'magcache') {
    rows.push(['MagCache', `threshold ${s.magcacheThreshold}, at most ${s.magcacheMaxConsecutiveSkips} skips in a row, retention ${s.magcacheRetentionRatio}`]);
  }
  return rows;
});

// ---- presets --------------------------------------------------------------------------------

// presetFields maps JobSpec's JSON names to the form's inputs.
const presetFields = {
  prompt: 'prompt', negativePrompt: 'negative', totalSecondLength: 'seconds', seed: 'seed', steps: 'steps', gs: 'gs',
  cfg: 'cfg', rs: 'rs', gpuMemoryPreservationGb: 'gpumem', mp4Crf: 'crf', resolution: 'resolution',
  latentWindowSize: 'window', variant: 'variant', cache: 'cache', magcacheThreshold: 'magcache-threshold',
  magcacheMaxConsecutiveSkips: 'magcache-max-skips', magcacheRetentionRatio: 'magcache-retention',
};

async function refreshPresets(selected) {
  const resp = await api('/v1/presets');
  const sel = $('preset');
  sel.replaceChildren(el('option', { value: '', textContent: 'none' }));
  for (const p of (resp && resp.presets) || []) sel.append(el('option', { value: p.name, textContent: p.name }));
  sel.value = selected || '';
}

// applyPreset fills the form with a preset's settings.
function applyPreset(spec) {
  for (const [k, id] of Object.entries(presetFields)) {
    if (spec[k] === undefined) continue;
    $(id).value = String(spec[k]);
  }
  if (spec.useTeacache === false && spec.cache === undefined) $('cache').value = 'none';
  if (spec.loras) $('loras').value = spec.loras.map((l) => `${l.path} ${l.strength ?? 1}`).join('\n');
  showMagCache();
}

$('preset').addEventListener('change', async () => {
  const name = $('preset').value;
  $('preset-status').textContent = '';
  if (!name) return;
  try {
    const resp = await api('/v1/presets/' + encodeURIComponent(name));
    applyPreset(resp.preset.spec || {});
    $('preset-status').textContent = `settings of "${name}" loaded`;
  } catch (e) { $('preset-status').textContent = e.message; }
});

$('preset-save').addEventListener('click', async () => {
  const name = $('preset-name').value.trim();
  if (!name) { $('preset-status').textContent = 'give the preset a name'; return; }
  try {
    const spec = specFromForm();
    for (const k of ['lane', 'preset', 'endStrength']) delete spec[k];
    await api('/v1/presets', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ name, spec }) });
    await refreshPresets(name);
    $('preset-status').textContent = `saved "${name}"`;
  } catch (e) { $('preset-status').textContent = e.message; }
});

$('preset-delete').addEventListener('click', async () => {
  const name = $('preset').value;
  if (!name) { $('preset-status').textContent = 'choose a preset to delete'; return; }
  try {
    await api('/v1/presets/' + encodeURIComponent(name), { method: 'DELETE' });
    await refreshPresets('');
    $('preset-status').textContent = `deleted "${name}"`;
  } catch (e) { $('preset-status').textContent = e.message; }
});

hooks.spec.push((spec) => { if ($('preset').value) spec.preset = $('preset').value; });
hooks.settings.push((job) => (job.spec && job.spec.preset ? [['preset', job.spec.preset]] : []));
refreshPresets('').catch(() => {});

// ---- batches --------------------------------------------------------------------------------

// Several start images make one batch: one job each, the form's settings for all.
hooks.submit.push(async (spec) => {
  const files = $('image').files;
  if (files.length < 2) return false;
  if ($('end-image').files[0]) throw new Error('an end image goes with one start image: submit the images one at a time');
  const form = new FormData();
  for (const f of files) form.append('image', f, f.name);
  form.append('spec', JSON.stringify(spec));
  $('submit').disabled = true;
  try {
    const resp = await api('/v1/batches', { method: 'POST', body: form });
    const b = resp.batch;
    for (const j of b.jobs) state.jobs.set(j.id, j);
    renderJobs();
    showBatch(b);
    select(b.jobs[0].id);
  } finally {
    $('submit').disabled = false;
  }
  return true;
});

function showBatch(b) {
  $('batch-box').hidden = false;
  $('batch-id').textContent = b.batchId;
  const n = (k) => b[k] || 0;
  $('batch-summary').textContent = `${b.jobs.length} jobs: ${n('queued')} queued, ${n('running')} running, ` +
    `${n('succeeded')} succeeded, ${n('failed')} failed, ${n('cancelled')} cancelled`;
  $('batch-box').dataset.done = String(!!b.done);
}

async function refreshBatch() {
  const id = $('batch-id').textContent;
  if ($('batch-box').hidden || !id) return;
  try { showBatch((await api('/v1/batches/' + encodeURIComponent(id))).batch); } catch (_) { /* shown again on the next tick */ }
}

$('batch-cancel').addEventListener('click', async () => {
  const id = $('batch-id').textContent;
  try {
    showBatch((await api(`/v1/batches/${encodeURIComponent(id)}:cancel`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: '{}' })).batch);
    refreshJobs();
  } catch (e) { $('batch-summary').textContent = e.message; }
});

// The live view's job belongs to a batch: show it (settings hooks run whenever a job is shown).
hooks.settings.push((job) => {
  const id = job.spec && job.spec.batchId;
  if (!id) { $('batch-box').hidden = true; return []; }
  if ($('batch-id').textContent !== id) { $('batch-id').textContent = id; $('batch-box').hidden = false; refreshBatch(); }
  return [['batch', id]];
});
setInterval(refreshBatch, 3000);

// ---- keyframes ------------------------------------------------------------------------------

function addKeyframeRow() {
  const row = el('div', { class: 'keyframe grid' },
    el('label', {}, 'At ', el('select', { class: 'kf-unit' },
      el('option', { value: 'section', textContent: 'section' }), el('option', { value: 'seconds', textContent: 'seconds' }))),
    el('label', {}, 'Section or time ', el('input', { class: 'kf-at', type: 'number', min: '0', step: 'any', value: '0' })),
    el('label', { class: 'file' }, 'Image ', el('input', { class: 'kf-image', type: 'file', accept: 'image/png,image/jpeg,image/webp' })),
    el('button', { type: 'button', class: 'kf-remove', textContent: 'Remove', onclick: () => row.remove() }));
  $('keyframes').append(row);
  return row;
}
$('keyframe-add').addEventListener('click', addKeyframeRow);

// keyframeRows are the rows with an image, in order.
function keyframeRows() {
  return [...document.querySelectorAll('#keyframes .keyframe')].filter((r) => r.querySelector('.kf-image').files[0]);
}

hooks.spec.push((spec) => {
  const rows = keyframeRows();
  if (!rows.length) return;
  spec.keyframes = rows.map((r, i) => {
    const v = Number(r.querySelector('.kf-at').value);
    if (!Number.isFinite(v) || v < 0) throw new Error(`keyframe ${i + 1}: the section or time must be a number from 0`);
    return r.querySelector('.kf-unit').value === 'seconds' ? { seconds: v } : { section: Math.trunc(v) };
  });
});
hooks.parts.push((form) => {
  for (const r of keyframeRows()) { const f = r.querySelector('.kf-image').files[0]; form.append('keyframe', f, f.name); }
});
hooks.submit.push(async () => {
  if (keyframeRows().length && $('image').files.length > 1) throw new Error('keyframes go with one start image: submit the images one at a time');
  return false;
});
hooks.settings.push((job) => {
  const ks = (job.spec && job.spec.keyframes) || [];
  return ks.length ? [['keyframes', ks.map((k) => (k.seconds !== undefined ? `${k.seconds} s` : `section ${k.section || 0}`)).join(', ')]] : [];
});

// ---- extend a video -------------------------------------------------------------------------

function extendsVideo() { return !!($('input-video').files[0] || $('extend-job').value.trim()); }

// A video (or a job's id) replaces the start image: the image input stops being required.
for (const id of ['input-video', 'extend-job']) {
  $(id).addEventListener('change', () => { $('image').required = !extendsVideo(); });
  $(id).addEventListener('input', () => { $('image').required = !extendsVideo(); });
}

hooks.submit.push(async (spec) => {
  if (!extendsVideo()) return false;
  if ($('image').files.length) throw new Error('a video extension takes no start image: clear one of them');
  if ($('end-image').files[0]) throw new Error('a video extension takes no end image');
  const video = $('input-video').files[0];
  const job = $('extend-job').value.trim();
  if (video && job) throw new Error("give a video or a job's id, not both");
  if (job) spec.inputVideoJobId = job;
  spec.videoContextFrames = num('video-context');
  spec.videoIncludeInput = $('video-include').checked;
  delete spec.endStrength;
  const form = new FormData();
  if (video) form.append('input_video', video, video.name);
  for (const f of hooks.parts) f(form);
  form.append('spec', JSON.stringify(spec));
  $('submit').disabled = true;
  try {
    const resp = await api('/v1/jobs', { method: 'POST', body: form });
    state.jobs.set(resp.job.id, resp.job);
    renderJobs();
    select(resp.job.id);
  } finally {
    $('submit').disabled = false;
  }
  return true;
});

hooks.settings.push((job) => {
  const s = job.spec || {};
  if (!s.inputVideoSha256) return [];
  const from = s.inputVideoJobId ? ` (job ${s.inputVideoJobId})` : '';
  return [['extends video', s.inputVideoSha256.slice(0, 12) + '…' + from],
    ['context frames', s.videoContextFrames ?? 5], ['output starts with the video', s.videoIncludeInput === false ? 'no' : 'yes']];
});
