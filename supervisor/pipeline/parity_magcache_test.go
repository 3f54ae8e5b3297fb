package pipeline_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/workers/transformer/dit"
)

// loadReferenceOrSkip opens a fixture of the project's reference set (testdata/reference, or
// $FRAMEPACK_REFERENCE_FIXTURES), skipping the test with the file and the script that makes it
// while the fixture has not been generated.
func loadReferenceOrSkip(t *testing.T, name, script string) *parity.Fixture {
	t.Helper()
	root, err := parity.ReferenceRoot()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, "cases", name+".json")
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		t.Skipf("reference fixture %s is not generated yet: run testdata/reference/%s on a machine with PyTorch (its docstring says how)", path, script)
	}
	fx := parity.LoadReference(t, name)
	// The pipeline's float32 sampler (on the cpu) embeds the timestep and the distilled guidance
	// as computed, as the float64 reference of testdata/parity does; a reference made with them
	// rounded through bf16 (the generator without --check before it defaulted to float64) differs
	// by ~3e-2 everywhere and is the wrong reference, not a failure of the pipeline.
	if p, _ := fx.Reference["precision"].(string); strings.Contains(p, "rounded through bf16") {
		t.Fatalf("reference fixture %s was generated with the timestep and guidance rounded through bf16 (%q): regenerate it with testdata/reference/%s --check (scripts/devrun/refs.sh does)", name, p, script)
	}
	return fx
}

// featuresScript is the generator of the reference fixtures of issue 33's features.
const featuresScript = "gen_pipeline_features.py"

// magCacheCase is a pipeline_magcache case as a job: an i2v or f1 case with the case's cache
// settings, and the steps the reference's MagCache skipped in each section (generation order).
type magCacheCase struct {
	i2vCase
	f1      bool
	total   int
	skipped [][]uint32
}

func loadMagCacheCase(t *testing.T, c parity.Case) magCacheCase {
	t.Helper()
	var mc magCacheCase
	switch c.Op {
	case opI2V:
		mc.i2vCase = loadCase(t, c)
		mc.total = len(mc.sections)
	case opF1:
		mc.i2vCase, mc.total = loadF1Case(t, c)
		mc.f1 = true
	default:
		t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
	}
	var cache string
	if !c.Param(t, "cache", &cache) {
		t.Fatalf("case %s: no param cache", c.Name)
	}
	mc.spec.Cache, mc.spec.UseTeacache = cache, nil
	if cache == plan.CacheMagCache {
		var th, ret float64
		var k uint32
		for name, v := range map[string]any{"magcache_threshold": &th, "magcache_max_consecutive_skips": &k,
			"magcache_retention_ratio": &ret, "magcache_skipped_steps": &mc.skipped} {
			if !c.Param(t, name, v) {
				t.Fatalf("case %s: no param %q", c.Name, name)
			}
		}
		mc.spec.MagcacheThreshold, mc.spec.MagcacheMaxConsecutiveSkips, mc.spec.MagcacheRetentionRatio = proto.Float64(th), proto.Uint32(k), proto.Float64(ret)
		if len(mc.skipped) != mc.total {
			t.Fatalf("case %s: skipped steps for %d sections, the case has %d", c.Name, len(mc.skipped), mc.total)
		}
	}
	return mc
}

// skippedBySection returns the steps the transformer stage of each section skipped.
func skippedBySection(t *testing.T, state, id string, total int) [][]uint32 {
	t.Helper()
	out := make([][]uint32, total)
	for _, r := range stageRecords(t, state, id) {
		if r.Name == framepackv1.Stage_STAGE_TRANSFORMER.String() && r.Err == "" && r.Section >= 0 && r.Section < total {
			out[r.Section] = r.CacheSkippedSteps
		}
	}
	return out
}

// TestParityPipelineMagCache runs every case of the pipeline_magcache reference fixture
// (FramePack's i2v loop and FramePack-F1's, each with FramePack-Studio's MagCache and without)
// as a job through a daemon with real workers: the steps MagCache skipped in each section must
// be exactly the reference's, and the outputs (each section's latents, the history, the pixels
// and uint8 frames) within the case's tolerance.
func TestParityPipelineMagCache(t *testing.T) {
	fx := loadReferenceOrSkip(t, "pipeline_magcache", featuresScript)
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		ran++
		t.Run(c.Name, func(t *testing.T) {
			mc := loadMagCacheCase(t, c)
			opts, job, evs := runParityJob(t, workers, mc.i2vCase)
			total := int(job.GetProgress().GetTotalSections())
			if total != mc.total {
				t.Fatalf("%d sections, the reference ran %d", total, mc.total)
			}
			if got := job.GetSpec().GetCache(); got != mc.spec.GetCache() {
				t.Errorf("stored cache %q, want %q", got, mc.spec.GetCache())
			}
			got := skippedBySection(t, opts.State, job.GetId(), total)
			for i := range total {
				var want []uint32
				if mc.skipped != nil {
					want = mc.skipped[i]
				}
				t.Logf("case %s section %d: skipped steps %v, reference %v", c.Name, i, got[i], want)
				if !slices.Equal(got[i], want) && (len(got[i]) != 0 || len(want) != 0) {
					t.Errorf("case %s section %d: skipped steps %v, the reference skipped %v", c.Name, i, got[i], want)
				}
			}
			checkEvents(t, mc.i2vCase, evs, total)
			if mc.f1 {
				checkOutputsF1(t, mc.i2vCase, opts.State, job, total)
			} else {
				checkOutputs(t, mc.i2vCase, opts.State, job, total)
			}
			checkSettingsCache(t, mc, job.GetResult().GetVideoPath())
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no case", fx.Name)
	}
}

// checkSettingsCache checks the settings beside the video name the cache and MagCache's
// settings.
func checkSettingsCache(t *testing.T, mc magCacheCase, mp4 string) {
	t.Helper()
	raw, err := os.ReadFile(mp4[:len(mp4)-len(filepath.Ext(mp4))] + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var st pipeline.Settings
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.Cache != mc.spec.GetCache() || st.TeaCache != (mc.spec.GetCache() == plan.CacheTeaCache) {
		t.Errorf("settings cache %q use_teacache %v, want %q", st.Cache, st.TeaCache, mc.spec.GetCache())
	}
	if mc.spec.GetCache() != plan.CacheMagCache {
		if st.MagCache != nil {
			t.Errorf("settings hold MagCache settings %+v for cache %q", st.MagCache, st.Cache)
		}
		return
	}
	want := "framepack"
	if mc.f1 {
		want = "framepack_f1"
	}
	m := st.MagCache
	if m == nil || m.Threshold != mc.spec.GetMagcacheThreshold() || m.MaxConsecutiveSkips != mc.spec.GetMagcacheMaxConsecutiveSkips() ||
		m.RetentionRatio != mc.spec.GetMagcacheRetentionRatio() || m.Calibration != want {
		t.Errorf("settings magcache %+v, want the spec's settings and calibration %s", m, want)
	}
}

// TestMagCacheFixtureMatters is the negative control of TestParityPipelineMagCache: the first
// MagCache case run without a cache must miss the reference's first section by far more than
// the case's tolerance, so the fixture does pin the skipped steps' values down.
func TestMagCacheFixtureMatters(t *testing.T) {
	fx := loadReferenceOrSkip(t, "pipeline_magcache", featuresScript)
	workers := buildWorkers(t)
	for _, c := range fx.Cases {
		mc := loadMagCacheCase(t, c)
		if mc.spec.GetCache() != plan.CacheMagCache || len(mc.skipped[0]) == 0 {
			continue
		}
		mc.spec.Cache = plan.CacheNone
		mc.spec.MagcacheThreshold, mc.spec.MagcacheMaxConsecutiveSkips, mc.spec.MagcacheRetentionRatio = nil, nil, nil
		opts, job, _ := runParityJob(t, workers, mc.i2vCase)
		jf := openJobFiles(t, opts.State, job.GetId(), mc.total)
		lat, shape := read(t, jf.sections[0], "history_latents")
		t0 := 0
		if mc.f1 {
			t0 = int(shape[2]) - mc.window
		} else if mc.total == 1 {
			t0 = 1
		}
		v, _ := framesT(lat, shape, t0, t0+mc.window)
		e := parity.RelL2(v, c.Intermediate(t, "section0_latents").F32)
		t.Logf("case %s without MagCache: section0_latents rel_l2=%.3g (tolerance %.3g)", c.Name, e, c.Tolerance.RelL2)
		if e < 5*c.Tolerance.RelL2 {
			t.Errorf("case %s: skipping steps %v moves section 0 by only %.3g: the fixture does not test them", c.Name, mc.skipped[0], e)
		}
		return
	}
	t.Fatalf("fixture %s has no MagCache case that skips a step in its first section", fx.Name)
}

// TestMagCacheJobSkips runs the pipeline fixture's first case with MagCache through a daemon
// with real workers: each section's transformer stage skips exactly the steps of the worker's
// rule (dit.MagCacheSkips, checked against FramePack-Studio's in dit's tests) for the job's
// bucket and steps, with FramePack's i2v calibration, and the settings beside the video say so.
// It needs no reference fixture; TestParityPipelineMagCache checks the values against Studio's.
func TestMagCacheJobSkips(t *testing.T) {
	fx := parity.Load(t, "pipeline")
	workers := buildWorkers(t)
	var c parity.Case
	for _, fc := range fx.Cases {
		if fc.Op == opI2V {
			c = fc
			break
		}
	}
	if c.Name == "" {
		t.Fatalf("fixture %s has no %s case", fx.Name, opI2V)
	}
	mc := magCacheCase{i2vCase: loadCase(t, c)}
	mc.total = len(mc.sections)
	mc.spec.Steps = max(mc.spec.GetSteps(), 4) // enough steps for a skip
	mc.spec.Cache, mc.spec.UseTeacache = plan.CacheMagCache, nil
	mc.spec.MagcacheThreshold, mc.spec.MagcacheMaxConsecutiveSkips, mc.spec.MagcacheRetentionRatio = proto.Float64(0.3), proto.Uint32(3), proto.Float64(0)
	opts, job, _ := runParityJob(t, workers, mc.i2vCase)
	jf := openJobFiles(t, opts.State, job.GetId(), mc.total)
	_, shape := read(t, jf.cond, "image_np")
	ratios, err := dit.MagRatios(dit.MagCacheFramePack, int(shape[0]), int(shape[1]), int(mc.spec.GetSteps()))
	if err != nil {
		t.Fatal(err)
	}
	var want []uint32
	for i, s := range dit.MagCacheSkips(ratios, 0.3, 3, 0) {
		if s {
			want = append(want, uint32(i))
		}
	}
	if len(want) == 0 {
		t.Fatalf("settings skip nothing at %v and %d steps: pick others", shape, mc.spec.GetSteps())
	}
	for i, got := range skippedBySection(t, opts.State, job.GetId(), mc.total) {
		if !slices.Equal(got, want) {
			t.Errorf("section %d skipped steps %v, want %v", i, got, want)
		}
	}
	mc.spec = job.GetSpec()
	checkSettingsCache(t, mc, job.GetResult().GetVideoPath())
}
