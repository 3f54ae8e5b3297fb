// Package parity loads the reference fixtures in testdata/parity (or any fixture set in the same
// format, chosen with the test knob envconfig.Fixtures) and compares results with them by relative L2 error.
//
// A fixture set is a folder with models/ and cases/<fixture>.json + cases/<fixture>.safetensors;
// see testdata/parity/README.md. Parity tests iterate over every case of a fixture by its op and
// read the model configs from the set, so they check fixture sets they have never seen.
package parity

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// EnvRoot names the environment variable that points at a fixture set.
var EnvRoot = envconfig.Fixtures.Name

var (
	moduleRootOnce sync.Once
	moduleRoot     string
)

// ModuleRoot returns the folder holding go.mod, found from the working directory.
func ModuleRoot() (string, error) {
	moduleRootOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err == nil {
			if p := strings.TrimSpace(string(out)); p != "" && p != os.DevNull {
				moduleRoot = filepath.Dir(p)
				return
			}
		}
		dir, err := os.Getwd()
		for err == nil {
			if _, e := os.Stat(filepath.Join(dir, "go.mod")); e == nil {
				moduleRoot = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	})
	if moduleRoot == "" {
		return "", fmt.Errorf("module root not found from the working directory")
	}
	return moduleRoot, nil
}

// Root returns the fixture set in use: $EnvRoot, or testdata/parity of the module.
func Root() (string, error) {
	return rootOf(EnvRoot, "parity")
}

// rootOf returns the fixture set that environment variable env names, or testdata/dir of the
// module.
func rootOf(env, dir string) (string, error) {
	if r := os.Getenv(env); r != "" {
		return filepath.Abs(r)
	}
	m, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(m, "testdata", dir), nil
}

// EnvReferenceRoot names the environment variable that points at the project's own reference
// fixtures (testdata/reference: cases made with the reference code by generator scripts kept
// beside them, for what testdata/parity does not cover). Each names the models it was made
// from (its "models", relative to its own set: testdata/parity/models for the project's).
var EnvReferenceRoot = envconfig.ReferenceFixtures.Name

// ReferenceRoot returns the project's own fixture set: $EnvReferenceRoot, or
// testdata/reference of the module.
func ReferenceRoot() (string, error) {
	return rootOf(EnvReferenceRoot, "reference")
}

// LoadReference opens fixture name of the project's own set (ReferenceRoot) for a test and
// closes it when the test ends.
func LoadReference(t testing.TB, name string) *Fixture {
	t.Helper()
	return loadFrom(t, ReferenceRoot, name)
}

// Tolerance is a case's accepted error.
type Tolerance struct {
	RelL2 float64 `json:"rel_l2"`
}

// HalfRelL2 is the relative L2 error every case is held to when the model runs with 16-bit
// activations (bf16 or fp16, f32 accumulation): the bf16 tolerance of the speed issues. A
// fixture's own tolerances are for f32 activations.
const HalfRelL2 = 2e-2

// ForActivations returns c with the tolerance of a run whose activations are 16-bit (half)
// or f32: the case's own, loosened to HalfRelL2 for a half run.
func (c Case) ForActivations(half bool) Case {
	if half {
		c.Tolerance.RelL2 = max(c.Tolerance.RelL2, HalfRelL2)
	}
	return c
}

// HalfActivations returns the 16-bit activation dtype a half parity run uses: the one
// the test knob envconfig.ActivationDType names ("bf16"/"bfloat16", "fp16"/"f16"/"float16"), else def (the
// dtype FramePack runs the model in).
func HalfActivations(def string) string {
	switch v := envconfig.ActivationDType.Get(); v {
	case "bf16", "bfloat16", "fp16", "f16", "float16":
		return v
	}
	return def
}

// Case is one reference computation.
type Case struct {
	Name          string                     `json:"name"`
	Op            string                     `json:"op"`
	Inputs        map[string]json.RawMessage `json:"inputs"`
	Outputs       map[string]json.RawMessage `json:"outputs"`
	Params        map[string]json.RawMessage `json:"params"`
	Intermediates map[string]json.RawMessage `json:"intermediates"`
	Tolerance     Tolerance                  `json:"tolerance"`
	Note          string                     `json:"note"`

	fx *Fixture
}

// Fixture is one cases/<name>.json with its tensors.
type Fixture struct {
	Name      string            `json:"fixture"`
	Models    map[string]string `json:"models"`
	TensorsAt string            `json:"tensors"`
	Cases     []Case            `json:"cases"`
	Reference map[string]any    `json:"reference"`

	// Root is the fixture set folder.
	Root    string
	tensors *safetensors.File
}

// Open reads cases/<name>.json of the fixture set at root and maps its tensors.
func Open(root, name string) (*Fixture, error) {
	path := filepath.Join(root, "cases", name+".json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read fixture: %w", err)
	}
	fx := &Fixture{}
	if err := json.Unmarshal(raw, fx); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	fx.Root = root
	if fx.TensorsAt != "" {
		fx.tensors, err = safetensors.Open(filepath.Join(root, "cases", fx.TensorsAt))
		if err != nil {
			return nil, fmt.Errorf("fixture %s: %w", name, err)
		}
	}
	for i := range fx.Cases {
		fx.Cases[i].fx = fx
	}
	return fx, nil
}

// Load opens fixture name of the set in use for a test and closes it when the test ends.
func Load(t testing.TB, name string) *Fixture {
	t.Helper()
	return loadFrom(t, Root, name)
}

// loadFrom opens fixture name of the set that root returns and closes it when the test ends.
func loadFrom(t testing.TB, root func() (string, error), name string) *Fixture {
	t.Helper()
	dir, err := root()
	if err != nil {
		t.Fatal(err)
	}
	fx, err := Open(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fx.Close() })
	return fx
}

// Close unmaps the fixture's tensors.
func (f *Fixture) Close() error {
	if f.tensors == nil {
		return nil
	}
	return f.tensors.Close()
}

// Tensors returns the fixture's tensor file (nil when it has none).
func (f *Fixture) Tensors() *safetensors.File { return f.tensors }

// ModelPath returns the absolute folder of model key (as named in the fixture's "models").
func (f *Fixture) ModelPath(key string) (string, error) {
	rel, ok := f.Models[key]
	if !ok {
		return "", fmt.Errorf("fixture %s names no model %q", f.Name, key)
	}
	return filepath.Join(f.Root, rel), nil
}

// Array is a tensor read from a fixture: float data (converted to float32) and, for integer
// dtypes, the exact integer values too.
type Array struct {
	Key   string
	DType safetensors.DType
	Shape []int64
	F32   []float32
	Ints  []int64 // only for I64, I32, U8 and BOOL
}

// Len returns the number of elements.
func (a Array) Len() int { return len(a.F32) }

// ReadTensor reads the tensor stored under key.
func (f *Fixture) ReadTensor(key string) (Array, error) {
	if f.tensors == nil {
		return Array{}, fmt.Errorf("fixture %s has no tensor file", f.Name)
	}
	info, ok := f.tensors.Info(key)
	if !ok {
		return Array{}, fmt.Errorf("fixture %s: no tensor %q", f.Name, key)
	}
	v, shape, err := f.tensors.Float32(key)
	if err != nil {
		return Array{}, err
	}
	a := Array{Key: key, DType: info.DType, Shape: shape, F32: v}
	if !info.DType.IsFloat() {
		a.Ints, _, err = f.tensors.Int64(key)
		if err != nil {
			return Array{}, err
		}
	}
	return a, nil
}

func (c Case) ref(section map[string]json.RawMessage, kind, name string) (string, error) {
	raw, ok := section[name]
	if !ok {
		return "", fmt.Errorf("case %s: no %s %q", c.Name, kind, name)
	}
	var key string
	if err := json.Unmarshal(raw, &key); err != nil {
		return "", fmt.Errorf("case %s: %s %q is not a tensor key", c.Name, kind, name)
	}
	return key, nil
}

func (c Case) tensor(t testing.TB, section map[string]json.RawMessage, kind, name string) Array {
	t.Helper()
	key, err := c.ref(section, kind, name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.fx.ReadTensor(key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// Input reads the input tensor called name.
func (c Case) Input(t testing.TB, name string) Array { return c.tensor(t, c.Inputs, "input", name) }

// Output reads the expected output tensor called name.
func (c Case) Output(t testing.TB, name string) Array { return c.tensor(t, c.Outputs, "output", name) }

// Intermediate reads the intermediate tensor called name.
func (c Case) Intermediate(t testing.TB, name string) Array {
	return c.tensor(t, c.Intermediates, "intermediate", name)
}

// ModelPath returns the absolute folder of model key as the case's fixture names it: the models
// the case was made from.
func (c Case) ModelPath(key string) (string, error) { return c.fx.ModelPath(key) }

// HasInput reports whether the case has an input called name.
func (c Case) HasInput(name string) bool { _, ok := c.Inputs[name]; return ok }

// HasOutput reports whether the case has an output called name.
func (c Case) HasOutput(name string) bool { _, ok := c.Outputs[name]; return ok }

// InputValue decodes the inline (non-tensor) input called name into v.
func (c Case) InputValue(t testing.TB, name string, v any) {
	t.Helper()
	raw, ok := c.Inputs[name]
	if !ok {
		t.Fatalf("case %s: no input %q", c.Name, name)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("case %s: input %q: %v", c.Name, name, err)
	}
}

// Param decodes param name into v and reports whether it was present.
func (c Case) Param(t testing.TB, name string, v any) bool {
	t.Helper()
	raw, ok := c.Params[name]
	if !ok {
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("case %s: param %q: %v", c.Name, name, err)
	}
	return true
}

// RelL2 returns ‖got − want‖ / ‖want‖ computed in float64 (‖got‖ when want is all zero).
func RelL2(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range want {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if math.IsNaN(num) {
		return math.NaN()
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// MaxAbsDiff returns the largest |got − want| and how many elements differ at all.
func MaxAbsDiff(got, want []float32) (maxDiff float64, differing int) {
	if len(got) != len(want) {
		return math.Inf(1), len(want)
	}
	for i := range want {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		if d != 0 || math.IsNaN(d) {
			differing++
		}
		if d > maxDiff || math.IsNaN(d) {
			maxDiff = d
		}
	}
	return maxDiff, differing
}

// SameShape reports whether two shapes are equal.
func SameShape(a, b []int64) bool {
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

// Check compares got (of shape gotShape) with want under the case's tolerance, logs one line
// "case <name> <label>: rel_l2=… tol=…", fails the test when the shapes differ or the error is
// over the tolerance, and returns the error.
func (c Case) Check(t testing.TB, label string, got []float32, gotShape []int64, want Array) float64 {
	t.Helper()
	return c.CheckTol(t, label, got, gotShape, want, c.Tolerance.RelL2)
}

// CheckTol is Check with an explicit tolerance (for outputs an issue holds to another bound).
func (c Case) CheckTol(t testing.TB, label string, got []float32, gotShape []int64, want Array, tol float64) float64 {
	t.Helper()
	if !SameShape(gotShape, want.Shape) {
		t.Errorf("case %s %s: shape %v, want %v", c.Name, label, gotShape, want.Shape)
		return math.Inf(1)
	}
	e := RelL2(got, want.F32)
	t.Logf("case %s %s: rel_l2=%.3g tol=%.3g", c.Name, label, e, tol)
	if !(e <= tol) {
		t.Errorf("case %s %s: rel_l2 %.6g over tolerance %.3g", c.Name, label, e, tol)
	}
	return e
}
