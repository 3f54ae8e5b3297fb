package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// TestParityTextencExtraPrompts encodes every textenc.encode_prompt_conds case of a parameter
// set in one stage (a timed prompt's texts: the first as the prompt, the others as
// extra_prompts, at cfg 2 with a negative) and checks each case's outputs against the fixture.
func TestParityTextencExtraPrompts(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	p, _ := loadWorker(t, dir)
	a := shmtest.Arena(t, "job")
	var cases []parity.Case
	for _, c := range fx.Cases {
		switch c.Op {
		case "textenc.encode_prompt_conds":
			if len(cases) == 0 || encodeParams(t, c) == encodeParams(t, cases[0]) {
				cases = append(cases, c)
			}
		case "tokenize":
		default:
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
		}
	}
	if len(cases) < 2 {
		t.Skipf("fewer than two encode cases share parameters (%d)", len(cases))
	}
	prompt := func(c parity.Case) string {
		var s string
		c.InputValue(t, "prompt", &s)
		return s
	}
	req := stageRequest(prompt(cases[0]), "blurry", 2, encodeParams(t, cases[0]))
	stageRefs(t, a, &req)
	for i, c := range cases[1:] {
		vec := workertest.OutputRef(t, a, fmt.Sprintf("extra-%d", i), "llama_vec")
		req.ExtraPrompts = append(req.ExtraPrompts, workerkit.ExtraPrompt{Prompt: prompt(c), LlamaVec: vec,
			LlamaMask: workerkit.TensorRef{Path: vec.Path, Name: "llama_mask"}, ClipPooler: workerkit.TensorRef{Path: vec.Path, Name: "clip_pooler"}})
	}
	ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
	defer cancel()
	res, err := p.Run(ctx, &workerkit.RunRequest{JobID: "test", Stage: &req}, nil)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if want := 6 + 3*len(req.ExtraPrompts); len(res.Outputs) != want {
		t.Fatalf("%d outputs, want %d", len(res.Outputs), want)
	}
	vec, vecShape := workertest.ReadF32(t, res.Outputs[0])
	pooler, poolerShape := workertest.ReadF32(t, res.Outputs[2])
	checkEncodeOutputs(t, cases[0], "prompt ", vec, vecShape, workertest.ReadI64(t, res.Outputs[1]), pooler, poolerShape)
	for i, c := range cases[1:] {
		outs := res.Outputs[6+3*i : 9+3*i]
		vec, vecShape := workertest.ReadF32(t, outs[0])
		mask := workertest.ReadI64(t, outs[1])
		pooler, poolerShape := workertest.ReadF32(t, outs[2])
		checkEncodeOutputs(t, c, fmt.Sprintf("extra prompt %d ", i), vec, vecShape, mask, pooler, poolerShape)
	}
}
