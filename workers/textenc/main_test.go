package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// snapshotDir returns a folder laid out as a HunyuanVideo snapshot (text_encoder/,
// text_encoder_2/, tokenizer/, tokenizer_2/) for the fixture's models: their common parent when
// they are laid out so, otherwise a temporary folder of links.
func snapshotDir(t *testing.T, fx *parity.Fixture) string {
	t.Helper()
	keys := []string{"text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"}
	paths := map[string]string{}
	for _, k := range keys {
		p, err := fx.ModelPath(k)
		if err != nil {
			t.Fatal(err)
		}
		paths[k] = p
	}
	parent := filepath.Dir(paths[keys[0]])
	standard := true
	for _, k := range keys {
		if paths[k] != filepath.Join(parent, k) {
			standard = false
		}
	}
	if standard {
		return parent
	}
	dir := t.TempDir()
	for _, k := range keys {
		if err := os.Symlink(paths[k], filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// testLog is a quiet logger for worker processes (their stderr still reaches failures).
func testLog() *logrus.Entry {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	return logrus.NewEntry(l)
}

// loadWorker starts a worker and loads modelDir into it, on workertest.Backend().
func loadWorker(t *testing.T, modelDir string) (*workerkit.Process, *workerkit.LoadResponse) {
	t.Helper()
	p, _ := workertest.Start(t, "textenc")
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: modelDir, Backend: workertest.Backend()})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return p, resp
}

// segmentCount numbers the segments stageRefs makes.
var segmentCount atomic.Int64

// outputs are the output tensors of a text_encode stage, read back from shared memory: the six
// always written, then the optional token outputs the request set (nil when not set).
type outputs struct {
	LlamaVec, ClipPooler, LlamaVecN, ClipPoolerN []float32
	LlamaVecShape, ClipPoolerShape               []int64
	LlamaMask, LlamaMaskN                        []int64

	LlamaIDs, LlamaAttentionMask, ClipIDs []int64
	TokenRefs                             []workerkit.TensorRef // as written, in request order
}

// stageRefs fills the output refs of req with segments of a (positive outputs in one file,
// negative outputs in another, to cover both layouts).
func stageRefs(t *testing.T, a *shm.Arena, req *workerkit.TextEncodeRequest) {
	t.Helper()
	n := segmentCount.Add(1)
	pos, err := a.NewSegment(fmt.Sprintf("cond-%d", n))
	if err != nil {
		t.Fatal(err)
	}
	neg, err := a.NewSegment(fmt.Sprintf("cond-n-%d", n))
	if err != nil {
		t.Fatal(err)
	}
	req.LlamaVec = workerkit.TensorRef{Path: pos, Name: "llama_vec"}
	req.LlamaMask = workerkit.TensorRef{Path: pos, Name: "llama_mask"}
	req.ClipPooler = workerkit.TensorRef{Path: pos, Name: "clip_pooler"}
	req.LlamaVecN = workerkit.TensorRef{Path: neg, Name: "llama_vec"}
	req.LlamaMaskN = workerkit.TensorRef{Path: neg, Name: "llama_mask"}
	req.ClipPoolerN = workerkit.TensorRef{Path: neg, Name: "clip_pooler"}
}

// tokenOutputRefs asks req for the optional token outputs, in a segment of a of their own, the
// attention mask as U8 (the ids in the default dtype).
func tokenOutputRefs(t *testing.T, a *shm.Arena, req *workerkit.TextEncodeRequest) {
	t.Helper()
	path, err := a.NewSegment(fmt.Sprintf("tokens-%d", segmentCount.Add(1)))
	if err != nil {
		t.Fatal(err)
	}
	req.LlamaIDs = workerkit.TensorRef{Path: path, Name: "llama_ids"}
	req.LlamaAttentionMask = workerkit.TensorRef{Path: path, Name: "llama_attention_mask", DType: safetensors.U8}
	req.ClipIDs = workerkit.TensorRef{Path: path, Name: "clip_ids"}
}

// readOutputs maps the result's segments and reads the six tensors and the token outputs req
// set.
func readOutputs(t *testing.T, req *workerkit.TextEncodeRequest, res *workerkit.Result) outputs {
	t.Helper()
	var tokens []*[]int64
	var o outputs
	for _, x := range []struct {
		ref workerkit.TensorRef
		dst *[]int64
	}{{req.LlamaIDs, &o.LlamaIDs}, {req.LlamaAttentionMask, &o.LlamaAttentionMask}, {req.ClipIDs, &o.ClipIDs}} {
		if x.ref.Path != "" || x.ref.Name != "" {
			tokens = append(tokens, x.dst)
		}
	}
	if len(res.Outputs) != 6+len(tokens) {
		t.Fatalf("%d outputs, want %d", len(res.Outputs), 6+len(tokens))
	}
	floats := func(r workerkit.TensorRef) ([]float32, []int64) {
		m, err := shm.Open(r.Path)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		v, shape, err := m.Float32(r.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !parity.SameShape(shape, r.Shape) {
			t.Errorf("%s: file shape %v, result says %v", r.Name, shape, r.Shape)
		}
		return v, shape
	}
	o.LlamaVec, o.LlamaVecShape = floats(res.Outputs[0])
	o.LlamaMask = workertest.ReadI64(t, res.Outputs[1])
	o.ClipPooler, o.ClipPoolerShape = floats(res.Outputs[2])
	o.LlamaVecN, _ = floats(res.Outputs[3])
	o.LlamaMaskN = workertest.ReadI64(t, res.Outputs[4])
	o.ClipPoolerN, _ = floats(res.Outputs[5])
	for i, dst := range tokens {
		r := res.Outputs[6+i]
		*dst = workertest.ReadI64(t, r)
		if int64(len(*dst)) != shapeSize(r.Shape) {
			t.Errorf("%s: %d values, result says shape %v", r.Name, len(*dst), r.Shape)
		}
		o.TokenRefs = append(o.TokenRefs, r)
	}
	return o
}

func shapeSize(s []int64) int64 {
	n := int64(1)
	for _, d := range s {
		n *= d
	}
	return n
}

// runStage runs one text_encode stage on p and reads its outputs.
func runStage(t *testing.T, p *workerkit.Process, a *shm.Arena, req workerkit.TextEncodeRequest) (outputs, []workerkit.Event) {
	t.Helper()
	stageRefs(t, a, &req)
	ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
	defer cancel()
	var events []workerkit.Event
	res, err := p.Run(ctx, &workerkit.RunRequest{JobID: "test", Stage: &req}, func(e workerkit.Event) error {
		events = append(events, e)
		return nil
	})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return readOutputs(t, &req, res), events
}
