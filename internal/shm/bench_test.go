package shm_test

import (
	"fmt"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
)

// BenchmarkSegmentWriteRead measures moving one 256 MiB tensor through shared memory: the
// producer creates the segment, writes the tensor and commits; the consumer maps the segment
// (Open) and reads every byte out (a copy into its own buffer, as a host-to-device upload would).
// Bytes per op count the tensor once; the goal is at least 2 GB/s.
//
//   - pwrite: Create + Write (the tensor is in the producer's memory).
//   - mapped: Create + fill through Bytes (zero-copy producers; page faults on the writer side).
//   - preallocated: like pwrite, but the supervisor preallocated the segment beforehand
//     (Preallocate, untimed), as it can while the producing stage computes.
func BenchmarkSegmentWriteRead(b *testing.B) {
	const n = 256 << 20
	a := shmtest.Arena(b, "bench")
	src := make([]byte, n)
	fillPattern(src, 3)
	dst := make([]byte, n)
	copy(dst, src) // fault the pages in outside the timed loop
	specs := []shm.TensorSpec{{Name: "x", DType: safetensors.U8, Shape: []int64{n}}}
	i := 0
	for _, mode := range []string{"pwrite", "mapped", "preallocated"} {
		b.Run(mode, func(b *testing.B) {
			b.SetBytes(n)
			for b.Loop() {
				name := fmt.Sprint("s", i)
				i++
				path := must(a.NewSegment(name))
				if mode == "preallocated" {
					b.StopTimer()
					if err := shm.Preallocate(path, specs); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				w, err := shm.Create(path, specs)
				if err != nil {
					b.Fatal(err)
				}
				if mode == "mapped" {
					copy(must(w.Bytes("x")), src)
				} else if err := w.Write("x", src); err != nil {
					b.Fatal(err)
				}
				if _, err := w.Commit(); err != nil {
					b.Fatal(err)
				}
				m, err := shm.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				copy(dst, must(m.Bytes("x")))
				m.Close()
				b.StopTimer() // freeing the memory happens later, off the critical path
				if err := a.Remove(name); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			if dst[12345] != src[12345] {
				b.Fatal("data lost")
			}
		})
	}
}
