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
	"github.com/framepackd/framepackd/workers/transformer/dit"
)

// loadStreaming starts a worker and loads dir with req's memory settings; it checks the
// residency the response reports against total blocks.
func loadStreaming(t *testing.T, dir string, req workerkit.LoadRequest) (*workerkit.Process, *workerkit.LoadResponse) {
	t.Helper()
	p, _ := workertest.Start(t, "transformer")
	req.ModelDir, req.Backend = dir, workertest.Backend()
	resp, err := p.Load(workertest.Ctx(t), &req)
	if err != nil {
		t.Fatalf("load (cap %d, max resident %d): %v", req.MemoryCapBytes, req.MaxResidentBlocks, err)
	}
	return p, resp
}

func outputs(t *testing.T, res *workerkit.Result) [][]float32 {
	t.Helper()
	var out [][]float32
	for _, o := range res.Outputs {
		if o.DType == "F32" {
			out = append(out, readFloat(t, o))
		}
	}
	if len(out) == 0 {
		t.Fatalf("no float32 outputs in %+v", res.Outputs)
	}
	return out
}

func sameOutputs(t *testing.T, what string, got, want [][]float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outputs, all-resident %d", what, len(got), len(want))
	}
	for k := range got {
		if len(got[k]) != len(want[k]) {
			t.Fatalf("%s: output %d has %d values, all-resident %d", what, k, len(got[k]), len(want[k]))
		}
		for i := range got[k] {
			if math.Float32bits(got[k][i]) != math.Float32bits(want[k][i]) {
				t.Fatalf("%s: output %d value %d is %v, all-resident %v (not bit-identical)", what, k, i, got[k][i], want[k][i])
			}
		}
	}
}

// TestWorkerStreamingParity runs the transformer fixture's forward cases and a sampler
// section through workers that keep 1 and 3 blocks resident (max_resident_blocks) and
// compares every output bit for bit with an all-resident worker's; LoadResponse reports the
// residency.
func TestWorkerStreamingParity(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	sfx := parity.Load(t, "sampler")
	sdir, err := sfx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	sc := firstSampleCase(t, sfx)
	section := func(p *workerkit.Process) [][]float32 {
		s := writeCase(t, shmtest.Arena(t, "job"), sc)
		res, _, err := run(t, p, s.req)
		if err != nil {
			t.Fatalf("section: %v", err)
		}
		return outputs(t, res)
	}
	all, allResp := loadStreaming(t, dir, workerkit.LoadRequest{})
	if allResp.StreamedBlocks != 0 || allResp.ResidentBlocks == 0 {
		t.Fatalf("all-resident load: %d resident, %d streamed", allResp.ResidentBlocks, allResp.StreamedBlocks)
	}
	total := allResp.ResidentBlocks
	want := map[string][][]float32{}
	for _, c := range fx.Cases {
		if c.Op != opForward {
			continue
		}
		res, _, err := runForward(t, all, writeForwardCase(t, shmtest.Arena(t, "job"), c).req)
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		want[c.Name] = outputs(t, res)
	}
	sall, _ := loadStreaming(t, sdir, workerkit.LoadRequest{})
	wantSection := section(sall)

	for _, resident := range []uint32{1, 3} {
		p, resp := loadStreaming(t, dir, workerkit.LoadRequest{MaxResidentBlocks: resident})
		if resp.ResidentBlocks != resident || resp.StreamedBlocks != total-resident || resp.WeightBytes != allResp.WeightBytes {
			t.Fatalf("max_resident_blocks %d: response %d resident, %d streamed, %d weight bytes (all-resident %d)",
				resident, resp.ResidentBlocks, resp.StreamedBlocks, resp.WeightBytes, allResp.WeightBytes)
		}
		for _, c := range fx.Cases {
			if c.Op != opForward {
				continue
			}
			res, _, err := runForward(t, p, writeForwardCase(t, shmtest.Arena(t, "job"), c).req)
			if err != nil {
				t.Fatalf("case %s: %v", c.Name, err)
			}
			sameOutputs(t, c.Name, outputs(t, res), want[c.Name])
		}
		sp, _ := loadStreaming(t, sdir, workerkit.LoadRequest{MaxResidentBlocks: resident})
		sameOutputs(t, "section "+sc.Name, section(sp), wantSection)
	}
}

// TestWorkerStreamingMemoryCap: with a memory cap below the all-resident worker's peak the
// worker streams blocks, finishes the stage with the all-resident output, and its allocator
// peak (Stats) stays under the cap; a cap too small for even one streamed block fails Load
// with InvalidArgument and says so, before anything is loaded.
func TestWorkerStreamingMemoryCap(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	var c parity.Case
	for _, cc := range fx.Cases {
		if cc.Op == opForward {
			c = cc
			break
		}
	}
	all, allResp := loadStreaming(t, dir, workerkit.LoadRequest{})
	res, _, err := runForward(t, all, writeForwardCase(t, shmtest.Arena(t, "job"), c).req)
	if err != nil {
		t.Fatal(err)
	}
	want := outputs(t, res)
	peakAll := int64(res.Stats.AllocatorPeakBytes)
	act := peakAll - int64(allResp.DeviceAllocatedBytes)

	cfg, err := dit.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := dit.EstimateFootprint(cfg, nil, dit.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	need := fp.Need(0)
	if need+act >= peakAll {
		t.Fatalf("streaming needs %d + %d bytes, all-resident peaks at %d: the fixture cannot show streaming", need, act, peakAll)
	}
	memCap := need + act + (peakAll-need-act)/2
	// Without a workload the worker reserves no activations: it plans the weights into the
	// whole cap.
	_, resp := loadStreaming(t, dir, workerkit.LoadRequest{MemoryCapBytes: uint64(memCap - act)})
	if r, err := fp.Plan(memCap-act, 0, 0); err != nil || resp.ResidentBlocks != uint32(r) || resp.StreamedBlocks == 0 {
		t.Fatalf("cap %d: %d resident, %d streamed; want the plan's %d (%v)", memCap-act, resp.ResidentBlocks, resp.StreamedBlocks, r, err)
	}
	// The measured activations' room is left beside the weights through max_resident_blocks.
	r, err := fp.Plan(memCap, act, 0)
	if err != nil || r == 0 || r >= fp.Blocks() {
		t.Fatalf("plan for cap %d with %d of activations: %d resident, %v", memCap, act, r, err)
	}
	p2, resp2 := loadStreaming(t, dir, workerkit.LoadRequest{MemoryCapBytes: uint64(memCap), MaxResidentBlocks: uint32(r)})
	res, _, err = runForward(t, p2, writeForwardCase(t, shmtest.Arena(t, "job"), c).req)
	if err != nil {
		t.Fatalf("forward under cap %d (%d resident): %v", memCap, resp2.ResidentBlocks, err)
	}
	sameOutputs(t, "under cap", outputs(t, res), want)
	t.Logf("cap %d: %d resident, %d streamed; peak %d (all-resident %d)", memCap, resp2.ResidentBlocks, resp2.StreamedBlocks, res.Stats.AllocatorPeakBytes, peakAll)
	if int64(res.Stats.AllocatorPeakBytes) > memCap || res.Stats.MemoryCapBytes != uint64(memCap) {
		t.Errorf("peak %d, cap %d in stats; want the peak under the cap %d", res.Stats.AllocatorPeakBytes, res.Stats.MemoryCapBytes, memCap)
	}

	// gpu_memory_preservation_gb is kept free beside the weights (FramePack's rule): a reserve
	// that leaves room for the streamed minimum only streams every block it can.
	w := workerkit.Workload{Height: 64, Width: 96, LatentWindowSize: 3}
	est := cfg.ActivationBytes(dit.Workload{Height: 64, Width: 96, LatentWindowSize: 3})
	bigCap := fp.Need(fp.Blocks()) + est + (1 << 20)
	w.ReserveBytes = uint64(bigCap - need)
	_, resp3 := loadStreaming(t, dir, workerkit.LoadRequest{MemoryCapBytes: uint64(bigCap), Workload: &w})
	if r, err := fp.Plan(bigCap, max(est, int64(w.ReserveBytes)), 0); err != nil || resp3.ResidentBlocks != uint32(r) || resp3.StreamedBlocks == 0 {
		t.Fatalf("cap %d, reserve %d: %d resident, %d streamed; want the plan's %d (%v)", bigCap, w.ReserveBytes, resp3.ResidentBlocks, resp3.StreamedBlocks, r, err)
	}

	q, _ := workertest.Start(t, "transformer")
	_, err = q.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), MemoryCapBytes: uint64(need - 1)})
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeInvalidArgument || !strings.Contains(we.Message, "memory cap too small") {
		t.Fatalf("cap %d below the %d streaming needs: got %v, want InvalidArgument naming the cap", need-1, need, err)
	}
	st, err := q.Stats(workertest.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.AllocatorPeakBytes != 0 {
		t.Errorf("after the refused load the allocator peaked at %d bytes; want nothing loaded", st.AllocatorPeakBytes)
	}
}
