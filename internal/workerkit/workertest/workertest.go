// Package workertest is for tests that run worker binaries: it builds and starts them, bounds
// each call, writes stage inputs into shared memory and reads outputs back, and checks at the
// end of a test process that nothing was left behind. It is test code: only _test.go files
// import it.
package workertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// CallTimeout bounds one worker call of a test (a stage of the tiny fixture models takes
// seconds, even on a loaded 2-core machine).
const CallTimeout = 2 * time.Minute

// Main runs a package's tests, removes the binaries testbin built and fails the run when
// shared-memory test roots are left; TestMain exits with what it returns.
func Main(m *testing.M) int {
	code := m.Run()
	testbin.Cleanup()
	if left, err := shmtest.Leftovers(); err != nil || len(left) > 0 {
		fmt.Fprintf(os.Stderr, "shared-memory leftovers: %v %v\n", left, err)
		code = 1
	}
	return code
}

// EnvBackend is the variable that chooses the runtime's backend (runtime.EnvBackend, named here
// so that supervisor tests need not link the native runtime).
var EnvBackend = envconfig.Backend.Name

// Backend is the backend worker tests load their models on: the test knob envconfig.Backend ("cuda" when
// scripts/gpu-check.sh runs them), or "cpu" when it is unset.
func Backend() string {
	if b := envconfig.Backend.Get(); b != "" {
		return b
	}
	return "cpu"
}

// HalfActivations checks the activation dtype a Load reported ("fp32", "bf16" or "fp16"; fp32
// on the cpu backend unless the test knob envconfig.ActivationDType names another) and reports whether it
// is 16-bit: parity checks then hold the case to parity.HalfRelL2 (Case.ForActivations).
func HalfActivations(tb testing.TB, resp *workerkit.LoadResponse) bool {
	tb.Helper()
	switch resp.DType {
	case "fp32", "bf16", "fp16":
	default:
		tb.Fatalf("load reported activation dtype %q, want fp32, bf16 or fp16", resp.DType)
	}
	if Backend() == "cpu" && envconfig.ActivationDType.Get() == "" && resp.DType != "fp32" {
		tb.Fatalf("load on the cpu reported activations %s, want the cpu's default fp32", resp.DType)
	}
	return resp.DType != "fp32"
}

// Ctx returns the context of one worker call: CallTimeout, and no longer than the test.
func Ctx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(tb.Context(), CallTimeout)
	tb.Cleanup(cancel)
	return ctx
}

// Build builds the worker binaries ./workers/<model> in parallel (once per test process) and
// returns their paths by model.
func Build[M ~string](tb testing.TB, models ...M) map[M]string {
	tb.Helper()
	out := make(map[M]string, len(models))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range models {
		wg.Go(func() {
			p := testbin.Build(tb, "./workers/"+string(m))
			mu.Lock()
			out[m] = p
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// Start builds the worker ./workers/<name> and starts it with env (KEY=VALUE entries) added;
// its log entries, at debug level, go to the returned hook. The process is closed when the test
// ends.
func Start(tb testing.TB, name string, env ...string) (*workerkit.Process, *test.Hook) {
	tb.Helper()
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	p, err := workerkit.Start(Ctx(tb), workerkit.Config{Name: name, Path: testbin.Build(tb, "./workers/"+name),
		Env: env, Log: logrus.NewEntry(log), SocketDir: tb.TempDir()})
	if err != nil {
		tb.Fatalf("start %s worker: %v", name, err)
	}
	tb.Cleanup(func() { p.Close() })
	return p, hook
}

// Segment reserves segment seg in a and returns its path.
func Segment(tb testing.TB, a *shm.Arena, seg string) string {
	tb.Helper()
	p, err := a.NewSegment(seg)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// OutputRef reserves segment seg in a for an output tensor called name.
func OutputRef(tb testing.TB, a *shm.Arena, seg, name string) workerkit.TensorRef {
	tb.Helper()
	return workerkit.TensorRef{Path: Segment(tb, a, seg), Name: name}
}

// Write writes t as the one tensor of a new segment seg of a and returns its reference.
func Write(tb testing.TB, a *shm.Arena, seg string, t safetensors.Tensor) workerkit.TensorRef {
	tb.Helper()
	path := Segment(tb, a, seg)
	if _, err := shm.WriteSegment(path, []safetensors.Tensor{t}); err != nil {
		tb.Fatal(err)
	}
	return workerkit.TensorRef{Path: path, Name: t.Name}
}

// WriteF32 writes float32 values as tensor name of a new segment seg of a.
func WriteF32(tb testing.TB, a *shm.Arena, seg, name string, shape []int64, v []float32) workerkit.TensorRef {
	tb.Helper()
	return Write(tb, a, seg, safetensors.FromFloat32(name, shape, v))
}

// ReadF32 maps a written tensor and returns its values as float32 and its shape.
func ReadF32(tb testing.TB, r workerkit.TensorRef) ([]float32, []int64) {
	tb.Helper()
	m, err := shm.Open(r.Path)
	if err != nil {
		tb.Fatal(err)
	}
	defer m.Close()
	v, shape, err := m.Float32(r.Name)
	if err != nil {
		tb.Fatal(err)
	}
	return v, shape
}

// ReadI64 maps a written tensor and returns its values as int64.
func ReadI64(tb testing.TB, r workerkit.TensorRef) []int64 {
	tb.Helper()
	m, err := shm.Open(r.Path)
	if err != nil {
		tb.Fatal(err)
	}
	defer m.Close()
	v, _, err := m.Int64(r.Name)
	if err != nil {
		tb.Fatal(err)
	}
	return v
}

// Processes returns the pids of the live processes (zombies excluded) that run one of the
// binaries at paths: workers a test expects gone.
func Processes[K comparable](paths map[K]string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		exe = strings.TrimSuffix(exe, " (deleted)")
		for _, p := range paths {
			if exe != p {
				continue
			}
			var pid int
			fmt.Sscan(e.Name(), &pid)
			if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !strings.Contains(string(st), ") Z ") {
				out = append(out, pid)
			}
		}
	}
	return out
}
