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

hooks.settings.push((job) => {
  const s = job.spec || {};
  const cache = s.cache || (s.useTeacache === false ? 'none' : 'teacache');
  const rows = [['step cache', cache]];
  if (cache === 'magcache') {
    rows.push(['MagCache', `threshold ${s.magcacheThreshold}, at most ${s.magcacheMaxConsecutiveSkips} skips in a row, retention ${s.magcacheRetentionRatio}`]);
  }
  return rows;
});
