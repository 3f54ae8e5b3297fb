package nn

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// benchBlock is the tensors of one synthetic block: a transformer block's shapes in BF16
// (four 3072² projections with biases, two 3072×12288 MLP matrices; 216 MiB).
var benchBlock = []struct {
	name  string
	shape []int
}{
	{"q.weight", []int{3072, 3072}}, {"q.bias", []int{3072}},
	{"k.weight", []int{3072, 3072}}, {"k.bias", []int{3072}},
	{"v.weight", []int{3072, 3072}}, {"v.bias", []int{3072}},
	{"o.weight", []int{3072, 3072}}, {"o.bias", []int{3072}},
	{"up.weight", []int{12288, 3072}}, {"down.weight", []int{3072, 12288}},
}

const benchBlocks = 5 // ≈1.05 GiB

// writeBenchCheckpoint writes benchBlocks BF16 blocks "blocks.N.…" to a file in dir, returning
// its path and its data size.
func writeBenchCheckpoint(b *testing.B, dir string) (string, int64) {
	b.Helper()
	var infos []safetensors.TensorInfo
	var total int64
	for i := range benchBlocks {
		for _, t := range benchBlock {
			shape := make([]int64, len(t.shape))
			n := int64(2)
			for j, d := range t.shape {
				shape[j] = int64(d)
				n *= int64(d)
			}
			infos = append(infos, safetensors.TensorInfo{Name: fmt.Sprintf("blocks.%d.%s", i, t.name), DType: safetensors.BF16, Shape: shape})
			total += n
		}
	}
	hdr, err := safetensors.EncodeLayout(infos, safetensors.WriteOptions{})
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "model.safetensors")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if _, err := w.Write(hdr); err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + i>>9) // arbitrary BF16 bit patterns
	}
	for left := total; left > 0; left -= int64(len(chunk)) {
		if _, err := w.Write(chunk[:min(left, int64(len(chunk)))]); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path, total
}

// BenchmarkHostCopy builds the host copies of ≈1 GiB of BF16 blocks from a mapped checkpoint
// (in the page cache, mapped afresh each iteration as a load maps it): "append" is the former
// path (each block's buffer grown tensor by tensor), "exact" the loader's (one allocation per
// block, huge pages on Linux, parallel copies), "exact-1proc" the same on one core. Every
// iteration starts from memory returned to the kernel, as a worker's load does.
func BenchmarkHostCopy(b *testing.B) {
	path, total := writeBenchCheckpoint(b, b.TempDir())
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	b.Logf("transparent huge pages: %q, GOMAXPROCS %d", TransparentHugePages(), goruntime.GOMAXPROCS(0))
	open := func() *safetensors.Checkpoint {
		ck, err := safetensors.OpenCheckpoint(path)
		if err != nil {
			b.Fatal(err)
		}
		return ck
	}
	run := func(b *testing.B, build func(ck *safetensors.Checkpoint) (release func())) {
		b.SetBytes(total)
		var elapsed time.Duration
		for b.Loop() {
			b.StopTimer()
			ck := open()
			debug.FreeOSMemory()
			b.StartTimer()
			start := time.Now()
			release := build(ck)
			elapsed += time.Since(start)
			b.StopTimer()
			release()
			ck.Close()
			b.StartTimer()
		}
		b.ReportMetric(float64(total)*float64(b.N)/elapsed.Seconds()/1e9, "GB/s")
	}
	b.Run("append", func(b *testing.B) {
		run(b, func(ck *safetensors.Checkpoint) func() {
			bufs := make([][]byte, benchBlocks)
			for i := range benchBlocks {
				for _, t := range benchBlock {
					raw, err := ck.Bytes(fmt.Sprintf("blocks.%d.%s", i, t.name))
					if err != nil {
						b.Fatal(err)
					}
					bufs[i] = append(bufs[i], raw...)
				}
			}
			return func() { clear(bufs) }
		})
	})
	exact := func(b *testing.B) {
		run(b, func(ck *safetensors.Checkpoint) func() {
			l := NewLoader(rt, ck, Options{DType: runtime.BF16, WeightDType: runtime.AsStored}, "")
			hs := make([]*HostSource, benchBlocks)
			for i := range benchBlocks {
				hs[i] = l.BeginHost(fmt.Sprintf("blocks.%d.", i))
				for _, t := range benchBlock {
					l.Weight(fmt.Sprintf("blocks.%d.%s", i, t.name), t.shape...)
				}
				l.EndHost()
			}
			if _, _, err := l.Finish(); err != nil {
				b.Fatal(err)
			}
			return func() {
				for _, h := range hs {
					if err := h.Free(); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
	b.Run("exact", exact)
	b.Run("exact-1proc", func(b *testing.B) {
		defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(1))
		exact(b)
	})
}

// BenchmarkResidentLoad uploads ≈1 GiB of BF16 blocks from a mapped checkpoint (in the page
// cache) as resident weights: "load-tensor" one LoadTensor per tensor, "staged" through the
// staging ring (SetStaging, the default slots). The runtime is $FRAMEPACK_BACKEND's (cpu by
// default, where staging only adds a copy: its gain is a GPU's DMA from pinned memory, to be
// measured there).
func BenchmarkResidentLoad(b *testing.B) {
	path, total := writeBenchCheckpoint(b, b.TempDir())
	rt, err := runtime.New(runtime.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	ck, err := safetensors.OpenCheckpoint(path)
	if err != nil {
		b.Fatal(err)
	}
	defer ck.Close()
	b.Logf("backend %s, GOMAXPROCS %d", rt.Backend().Name, goruntime.GOMAXPROCS(0))
	for _, c := range []struct {
		name    string
		staging Staging
	}{
		{"load-tensor", Staging{}},
		{"staged", Staging{Slots: DefaultStagingSlots, SlotBytes: DefaultStagingSlotBytes}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(total)
			var elapsed time.Duration
			for b.Loop() {
				start := time.Now()
				l := NewLoader(rt, ck, Options{DType: runtime.BF16, WeightDType: runtime.AsStored}, "")
				l.SetStaging(c.staging)
				for i := range benchBlocks {
					for _, t := range benchBlock {
						l.Weight(fmt.Sprintf("blocks.%d.%s", i, t.name), t.shape...)
					}
				}
				ws, _, err := l.Finish()
				elapsed += time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if c.staging.Slots > 0 && ws.StagedBytes() != total {
					b.Fatalf("staged %d of %d bytes", ws.StagedBytes(), total)
				}
				b.StopTimer()
				ws.Free()
				b.StartTimer()
			}
			b.ReportMetric(float64(total)*float64(b.N)/elapsed.Seconds()/1e9, "GB/s")
		})
	}
}
