package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// codeOf returns the worker error code of err (CodeUnspecified for nil).
func codeOf(err error) workerkit.ErrorCode { return workerkit.CodeOf(err) }

// TestBadPrompts sends odd prompts through the worker process: a NUL byte and a 1 MB prompt
// are tokenised as the reference does (the long one truncated); a prompt that is not valid
// UTF-8 cannot even cross gRPC (proto3 strings are UTF-8), and the worker keeps serving.
func TestBadPrompts(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	p, _ := loadWorker(t, dir)
	a := shmtest.Arena(t, "job")
	enc := loadEncoder(t, dir)

	t.Run("nul byte", func(t *testing.T) {
		prompt := "a cat\x00 on a chair"
		o, _ := runStage(t, p, a, stageRequest(prompt, "", 1, Params{}))
		want, err := enc.Encode(prompt, Params{})
		if err != nil {
			t.Fatal(err)
		}
		if e := parity.RelL2(o.LlamaVec, want.LlamaVec); !(e <= 1e-5) || count(o.LlamaMask) != want.Rows {
			t.Errorf("worker and in-process encode differ: rel_l2 %g, %d rows vs %d", e, count(o.LlamaMask), want.Rows)
		}
		toks, err := enc.Tokenize(prompt, Params{})
		if err != nil {
			t.Fatal(err)
		}
		noNul, err := enc.Tokenize("a cat on a chair", Params{})
		if err != nil {
			t.Fatal(err)
		}
		if count(toks.LlamaMask) <= count(noNul.LlamaMask) {
			t.Errorf("the NUL byte added no Llama token (%d vs %d)", count(toks.LlamaMask), count(noNul.LlamaMask))
		}
	})

	t.Run("1 MB prompt truncated", func(t *testing.T) {
		prompt := strings.Repeat("a dog runs ", 1<<20/11+1)
		o, _ := runStage(t, p, a, stageRequest(prompt, prompt, 2, Params{}))
		if got := count(o.LlamaMask); got != DefaultLlamaMaxLength {
			t.Errorf("%d rows, want the %d of a truncated prompt", got, DefaultLlamaMaxLength)
		}
		if allZero(o.ClipPooler) || parity.RelL2(o.LlamaVecN, o.LlamaVec) != 0 {
			t.Error("outputs of the long prompt are zero or differ between the two sides")
		}
	})

	t.Run("invalid utf-8", func(t *testing.T) {
		req := stageRequest("caf\xe9", "", 1, Params{})
		stageRefs(t, a, &req)
		ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
		defer cancel()
		_, err := p.Run(ctx, &workerkit.RunRequest{Stage: &req}, nil)
		if err == nil {
			t.Fatal("invalid UTF-8 accepted")
		}
		t.Logf("invalid UTF-8 prompt: %v", err)
		// The worker is still alive and serving.
		runStage(t, p, a, stageRequest("still here", "", 1, Params{}))
		if _, exited := p.Exited(); exited {
			t.Fatal("the worker exited")
		}
	})
}

// TestRunBadRequests calls the worker in process (so requests gRPC would refuse to carry reach
// it too) and checks that each bad request is an InvalidArgument, never a crash.
func TestRunBadRequests(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	w := newWorker(&workerkit.Kit{Name: "textenc", Log: testLog()})
	ctx := t.Context()
	if _, err := w.Load(ctx, &workerkit.LoadRequest{ModelDir: dir}); err != nil {
		t.Fatal(err)
	}
	defer w.rt.Close()
	defer w.enc.Close()
	a := shmtest.Arena(t, "job")
	good := func() workerkit.TextEncodeRequest {
		r := stageRequest("a cat", "", 1, Params{})
		stageRefs(t, a, &r)
		return r
	}
	tests := []struct {
		name   string
		mutate func(r *workerkit.TextEncodeRequest)
		stage  workerkit.Stage
	}{
		{"invalid utf-8 prompt", func(r *workerkit.TextEncodeRequest) { r.Prompt = "\xff\xfe" }, nil},
		{"invalid utf-8 negative", func(r *workerkit.TextEncodeRequest) { r.NegativePrompt, r.CFG = "ok\xc3", 3 }, nil},
		{"nan cfg", func(r *workerkit.TextEncodeRequest) { r.CFG = float32(math.NaN()) }, nil},
		{"missing output", func(r *workerkit.TextEncodeRequest) { r.ClipPoolerN = workerkit.TensorRef{} }, nil},
		{"relative path", func(r *workerkit.TextEncodeRequest) { r.LlamaVec.Path = "out.safetensors" }, nil},
		{"partial path", func(r *workerkit.TextEncodeRequest) { r.LlamaVec.Path += ".partial" }, nil},
		{"same tensor twice", func(r *workerkit.TextEncodeRequest) { r.LlamaMask.Name = r.LlamaVec.Name }, nil},
		{"wrong output shape", func(r *workerkit.TextEncodeRequest) { r.ClipPooler.Shape = []int64{1, 3} }, nil},
		{"wrong output dtype", func(r *workerkit.TextEncodeRequest) { r.LlamaMask.DType = "F32" }, nil},
		{"clip length past positions", func(r *workerkit.TextEncodeRequest) { r.ClipMaxLength = 1000 }, nil},
		{"llama length past positions", func(r *workerkit.TextEncodeRequest) { r.LlamaMaxLength = 1 << 30 }, nil},
		{"huge pad length", func(r *workerkit.TextEncodeRequest) { r.PadLength = 1 << 31 }, nil},
		{"token ids as floats", func(r *workerkit.TextEncodeRequest) {
			r.LlamaIDs = workerkit.TensorRef{Path: r.LlamaVec.Path, Name: "ids", DType: "F32"}
		}, nil},
		{"token mask without a path", func(r *workerkit.TextEncodeRequest) { r.LlamaAttentionMask = workerkit.TensorRef{Name: "mask"} }, nil},
		{"token ids wrong shape", func(r *workerkit.TextEncodeRequest) {
			r.ClipIDs = workerkit.TensorRef{Path: r.LlamaVec.Path, Name: "clip_ids", Shape: []int64{1, 3}}
		}, nil},
		{"token ids on an output's name", func(r *workerkit.TextEncodeRequest) {
			r.ClipIDs = workerkit.TensorRef{Path: r.LlamaVec.Path, Name: r.LlamaVec.Name}
		}, nil},
		{"other stage", nil, &workerkit.VAEDecodeRequest{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stage workerkit.Stage = tc.stage
			if stage == nil {
				r := good()
				tc.mutate(&r)
				stage = &r
			}
			_, err := w.Run(ctx, &workerkit.RunRequest{Stage: stage}, nil)
			if codeOf(err) != workerkit.CodeInvalidArgument {
				t.Fatalf("error %v (code %v), want invalid argument", err, codeOf(err))
			}
			t.Logf("%v", err)
		})
	}
	// F16 and BF16 outputs are written when asked for.
	r := good()
	r.LlamaVec.DType, r.ClipPooler.DType, r.LlamaMask.DType = "F16", "BF16", "U8"
	res, err := w.Run(ctx, &workerkit.RunRequest{Stage: &r}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Outputs[0].DType != "F16" || res.Outputs[2].DType != "BF16" || res.Outputs[1].DType != "U8" || res.Outputs[4].DType != "BOOL" {
		t.Errorf("output dtypes %v %v %v %v", res.Outputs[0].DType, res.Outputs[2].DType, res.Outputs[1].DType, res.Outputs[4].DType)
	}
}

// copySnapshot makes a snapshot folder whose models and tokenizer_2 link to the fixture's and
// whose tokenizer/ holds tokenizer.json edited by edit (and the original tokenizer_config.json).
func copySnapshot(t *testing.T, src string, edit func(map[string]json.RawMessage)) string {
	t.Helper()
	dir := t.TempDir()
	for _, k := range []string{"text_encoder", "text_encoder_2", "tokenizer_2"} {
		if err := os.Symlink(filepath.Join(src, k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	tokDir := filepath.Join(dir, "tokenizer")
	if err := os.Mkdir(tokDir, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(src, "tokenizer", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		t.Fatal(err)
	}
	edit(top)
	if raw, err = json.Marshal(top); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tokDir, "tokenizer.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg, err := os.ReadFile(filepath.Join(src, "tokenizer", "tokenizer_config.json")); err == nil {
		if err := os.WriteFile(filepath.Join(tokDir, "tokenizer_config.json"), cfg, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestLoadRefusals checks that the worker process refuses what it cannot load with an
// InvalidArgument that names the problem, and stays up to say so.
func TestLoadRefusals(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	setType := func(key, typ string) func(map[string]json.RawMessage) {
		return func(top map[string]json.RawMessage) {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(top[key], &obj); err != nil || obj == nil {
				obj = map[string]json.RawMessage{}
			}
			obj["type"], _ = json.Marshal(typ)
			top[key], _ = json.Marshal(obj)
		}
	}
	tests := []struct {
		name     string
		modelDir string
		dtype    string
		want     string
	}{
		{"unknown tokenizer model", copySnapshot(t, dir, setType("model", "WordLevel")), "", "WordLevel"},
		{"unknown pre-tokenizer", copySnapshot(t, dir, setType("pre_tokenizer", "BertPreTokenizer")), "", "BertPreTokenizer"},
		{"missing folder", filepath.Join(t.TempDir(), "nothing"), "", "nothing"},
		{"unknown dtype", dir, "int8", "int8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := workertest.Start(t, "textenc")
			ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
			defer cancel()
			_, err := p.Load(ctx, &workerkit.LoadRequest{ModelDir: tc.modelDir, DType: tc.dtype})
			if err == nil {
				t.Fatal("load succeeded")
			}
			var we *workerkit.Error
			if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want an invalid argument naming %q", err, tc.want)
			}
			t.Logf("%v", err)
		})
	}
}

// TestHangFault makes the worker hang at an op (Fault.hang_at_op): the beacon shows it stuck in
// that op, Stats still answers, and the supervisor's kill ends it.
func TestHangFault(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	p, _ := workertest.Start(t, "textenc")
	ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
	defer cancel()
	const hangAt = 5
	if _, err := p.Load(ctx, &workerkit.LoadRequest{ModelDir: dir, Fault: &workerkit.Fault{HangAtOp: hangAt}}); err != nil {
		t.Fatal(err)
	}
	a := shmtest.Arena(t, "job")
	req := stageRequest("a cat", "", 1, Params{})
	stageRefs(t, a, &req)
	runErr := make(chan error, 1)
	go func() {
		_, err := p.Run(ctx, &workerkit.RunRequest{Stage: &req}, nil)
		runErr <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		snap, err := p.Beacon()
		if err == nil && snap.InOp && snap.OpSeq == hangAt {
			t.Logf("stuck in op %d %q, phase %s", snap.OpSeq, snap.Op, snap.Phase)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the beacon never showed op %d in progress: %+v (%v)", hangAt, snap, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	if _, err := p.Stats(sctx); err != nil {
		t.Errorf("stats while hung: %v", err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err == nil {
		t.Error("the hung run returned a result")
	}
}
