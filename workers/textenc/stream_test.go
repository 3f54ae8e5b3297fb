package main

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// TestWorkerStreamsLlamaLayers: a textenc worker loaded with max_resident_blocks 1 keeps one
// Llama layer resident, streams the rest (LoadResponse says so) and encodes the prompt and the
// negative prompt bit for bit as an all-resident worker does.
func TestWorkerStreamsLlamaLayers(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	a := shmtest.Arena(t, "job")
	req := stageRequest("a cat on a chair", "a dog", 2, Params{})

	all, allResp := loadWorker(t, dir)
	want, _ := runStage(t, all, a, req)

	p, _ := workertest.Start(t, "textenc")
	resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), MaxResidentBlocks: 1})
	if err != nil {
		t.Fatal(err)
	}
	if allResp.StreamedBlocks != 0 || resp.ResidentBlocks != 1 || resp.StreamedBlocks != allResp.ResidentBlocks-1 || resp.WeightBytes != allResp.WeightBytes {
		t.Fatalf("residency: all-resident %d/%d, max 1 gives %d resident, %d streamed (weights %d vs %d)",
			allResp.ResidentBlocks, allResp.StreamedBlocks, resp.ResidentBlocks, resp.StreamedBlocks, resp.WeightBytes, allResp.WeightBytes)
	}
	got, _ := runStage(t, p, a, req)
	for _, c := range []struct {
		name      string
		got, want []float32
	}{{"llama_vec", got.LlamaVec, want.LlamaVec}, {"llama_vec_n", got.LlamaVecN, want.LlamaVecN},
		{"clip_pooler", got.ClipPooler, want.ClipPooler}} {
		if len(c.got) != len(c.want) || len(c.got) == 0 {
			t.Fatalf("%s: %d values, all-resident %d", c.name, len(c.got), len(c.want))
		}
		for i := range c.got {
			if math.Float32bits(c.got[i]) != math.Float32bits(c.want[i]) {
				t.Fatalf("%s value %d: %v, all-resident %v", c.name, i, c.got[i], c.want[i])
			}
		}
	}
}

// TestWorkerLlamaCapTooSmall: a cap that holds the loaded encoders but not Llama's activation
// estimate beside its layer slots fails Load with InvalidArgument naming the cap.
func TestWorkerLlamaCapTooSmall(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	_, allResp := loadWorker(t, dir)
	p, _ := workertest.Start(t, "textenc")
	_, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), MemoryCapBytes: allResp.DeviceAllocatedBytes})
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument || !strings.Contains(we.Message, "memory cap too small for the llama") {
		t.Fatalf("cap %d (the weights, no room for activations): got %v, want InvalidArgument naming the cap", allResp.DeviceAllocatedBytes, err)
	}
	t.Log(err)
}
