package watchdog_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

func TestMain(m *testing.M) {
	if v := os.Getenv(daemonEnv); v != "" {
		os.Exit(daemonMain(v))
	}
	os.Exit(workertest.Main(m))
}

// testOp is the op deadline of these tests: every op of the tiny models takes milliseconds, so
// a few seconds only ever catch an injected hang, even on a loaded 2-core machine.
const testOp = 3 * time.Second

// testDeadlines are the stage limits of these tests.
func testDeadlines() watchdog.Deadlines {
	return watchdog.Deadlines{Default: watchdog.Cost{Base: 2 * time.Minute}, OpMin: testOp, Stall: 10 * time.Second,
		Poll: 50 * time.Millisecond}
}

// quietLog discards log lines unless FRAMEPACK_TEST_LOG is set.
func quietLog() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	if os.Getenv("FRAMEPACK_TEST_LOG") != "" {
		l.SetOutput(os.Stderr)
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}

// modelsDir is the parity fixtures' model folder.
func modelsDir(t testing.TB) string {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "models")
}

// workerBins builds the worker binaries (once per test process).
func workerBins(t testing.TB) map[lanes.Model]string {
	t.Helper()
	return workertest.Build(t, lanes.TextEnc, lanes.VAE, lanes.ClipVision, lanes.Transformer, "probe")
}

// rig is one CPU lane with real workers under a watchdog.
type rig struct {
	lane    *lanes.Lane
	wd      *watchdog.Watchdog
	cache   *convcache.Cache
	ledger  *faults.Ledger
	arena   *shm.Arena
	models  string
	bins    map[lanes.Model]string
	sockets string
}

// rigOpts adjust a rig's watchdog before it is made.
type rigOpts func(*watchdog.Config)

func newRig(t *testing.T, opts ...rigOpts) *rig {
	t.Helper()
	bins := workerBins(t)
	dir := t.TempDir()
	sockets, err := os.MkdirTemp("", "fpw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockets) })
	ledger, err := faults.NewLedger(filepath.Join(dir, "vram"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := convcache.Open(filepath.Join(dir, "conv-cache.json"))
	if err != nil {
		t.Fatal(err)
	}
	log := quietLog()
	lane, err := lanes.New(lanes.Config{Name: "cpu", Backend: "cpu", SocketDir: sockets, Log: logrus.NewEntry(log),
		Env: []string{faults.EnvFakeVRAMDir + "=" + ledger.Dir()},
		WorkerPath: func(m lanes.Model) (string, error) {
			if p, ok := bins[m]; ok {
				return p, nil
			}
			return "", fmt.Errorf("no %s worker", m)
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lane.Close() })
	cfg := watchdog.Config{Lane: "cpu", LaneBackend: "cpu", Deadlines: testDeadlines(), ConvCache: cache,
		Recovery: &watchdog.Recovery{Memory: watchdog.FakeVRAM{L: ledger}},
		Probe: watchdog.ProbeWorker(workerkit.Config{Path: bins["probe"], SocketDir: sockets, Log: logrus.NewEntry(log)},
			"cpu", 0, watchdog.DefaultProbeAllocate),
		ProbeTimeout: 20 * time.Second, Log: logrus.NewEntry(log)}
	for _, o := range opts {
		o(&cfg)
	}
	wd, err := watchdog.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wd.Close)
	return &rig{lane: lane, wd: wd, cache: cache, ledger: ledger, arena: shmtest.Arena(t, "faults"), models: modelsDir(t),
		bins: bins, sockets: sockets}
}

// attempt returns the AttemptFunc that runs st on the rig's lane, as the pipeline does (the
// worker's reported residency and traits kept on the attempt for the ladder), and keeps the
// last report in *out.
func (r *rig) attempt(st lanes.Stage, out *lanes.Report) watchdog.AttemptFunc {
	return func(ctx context.Context, a *watchdog.Attempt) error {
		att := st
		att.Attach = func(p lanes.Proc) func() { return a.Attach(p.(watchdog.Target)) }
		att.Load = a.Override()
		att.Request = att.Load.ApplyStage(st.Request)
		rep, err := r.lane.Run(ctx, att)
		*out = rep
		a.ResidentBlocks, a.StreamedBlocks = rep.ResidentBlocks, rep.StreamedBlocks
		if rep.Loaded != nil {
			a.Traits = rep.Loaded.Traits
		}
		return err
	}
}

var segments int

// segment reserves a fresh segment in the rig's arena.
func (r *rig) segment(t *testing.T, name string) string {
	t.Helper()
	segments++
	p, err := r.arena.NewSegment(name + "-" + strconv.Itoa(segments))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// decodeStage is a VAE decode of seeded latents [1, 16, 2, 4, 4] (5 frames of 32×32 px).
func (r *rig) decodeStage(t *testing.T, seed uint64) (lanes.Stage, workerkit.TensorRef) {
	t.Helper()
	shape := []int64{1, 16, 2, 4, 4}
	data := make([]float32, 16*2*4*4)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range data {
		data[i] = float32(rng.NormFloat64())
	}
	in := r.segment(t, "latents")
	if _, err := shm.WriteSegment(in, []safetensors.Tensor{safetensors.FromFloat32("latents", shape, data)}); err != nil {
		t.Fatal(err)
	}
	out := workerkit.TensorRef{Path: r.segment(t, "pixels"), Name: "pixels"}
	return lanes.Stage{Model: lanes.VAE, ModelDir: filepath.Join(r.models, "hunyuanvideo", "vae"), JobID: "faults",
		Request: &workerkit.VAEDecodeRequest{Latents: workerkit.TensorRef{Path: in, Name: "latents"}, Pixels: out,
			Tiling: &workerkit.VAETiling{EnableSpatialTiling: true}}}, out
}

// textStage is a text encode of prompt.
func (r *rig) textStage(t *testing.T, prompt string) (lanes.Stage, workerkit.TensorRef) {
	t.Helper()
	pos, neg := r.segment(t, "text"), r.segment(t, "text-n")
	ref := func(p, n string) workerkit.TensorRef { return workerkit.TensorRef{Path: p, Name: n} }
	req := &workerkit.TextEncodeRequest{Prompt: prompt, CFG: 1,
		LlamaVec: ref(pos, "llama_vec"), LlamaMask: ref(pos, "llama_mask"), ClipPooler: ref(pos, "clip_pooler"),
		LlamaVecN: ref(neg, "llama_vec"), LlamaMaskN: ref(neg, "llama_mask"), ClipPoolerN: ref(neg, "clip_pooler")}
	return lanes.Stage{Model: lanes.TextEnc, ModelDir: filepath.Join(r.models, "hunyuanvideo"), JobID: "faults", Request: req},
		req.LlamaVec
}

// readF32 reads a float tensor the stage wrote.
func readF32(t *testing.T, ref workerkit.TensorRef) []float32 {
	t.Helper()
	f, err := safetensors.Open(ref.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _, err := f.Float32(ref.Name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// runClean runs st once without faults and returns its output.
func (r *rig) runClean(t *testing.T, st lanes.Stage, out workerkit.TensorRef) []float32 {
	t.Helper()
	var rep lanes.Report
	if err := r.wd.Job("clean", nil).Run(t.Context(), watchdog.StageInfo{Kind: kindOf(st)}, r.attempt(st, &rep)); err != nil {
		t.Fatalf("clean run: %v", err)
	}
	v := readF32(t, out)
	os.Remove(out.Path)
	return v
}

// equal reports whether two outputs are bit-identical.
func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// groupGone fails t if process group pgid still has a live member.
func groupGone(t *testing.T, pgid int) {
	t.Helper()
	if m, err := watchdog.GroupMembers(pgid); err != nil || len(m) > 0 {
		t.Fatalf("process group %d: members %v (%v)", pgid, m, err)
	}
}

// children lists the live child processes of pid.
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		raw, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 || f[0] == "Z" {
			continue
		}
		if pp, _ := strconv.Atoi(f[1]); pp == pid {
			c, _ := strconv.Atoi(e.Name())
			out = append(out, c)
		}
	}
	return out
}
