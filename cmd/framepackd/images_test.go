package main

import (
	"bufio"
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// peakRSS returns a process's peak resident set (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// bigPNG is a w×h RGB PNG of one colour: a small file that decodes to many bytes.
func bigPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	c := color.NRGBA{200, 120, 40, 255}
	for i := 0; i < len(img.Pix); i += 4 {
		img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = c.R, c.G, c.B, c.A
	}
	var b bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// maxBurstRSS is the stated bound on the daemon's peak RSS while it checks 20 concurrent
// uploads of a 6000×6000 PNG (36 MP, about 250 MB decoded each): two decodes at a time and the
// memory handed back after each keep it under this.
const maxBurstRSS = 900 << 20

// TestConcurrentLargeUploadsBoundedRSS is issue 15's image-memory item: 20 concurrent
// submissions of a 6000×6000 PNG keep the daemon's peak RSS under maxBurstRSS (ten of them took
// it to 2.5 GB before decodes were bounded), and an image over --max-image-pixels is refused
// from its header, naming the flag.
func TestConcurrentLargeUploadsBoundedRSS(t *testing.T) {
	f := newFixture(t)
	f.withWorkers(t)
	cmd, logs, conn := f.start(t, "--lanes", "cpu", "--log-level", "warn")
	client := framepackv1.NewJobServiceClient(conn)
	img := bigPNG(t, 6000, 6000)
	t.Logf("png: %d bytes", len(img))
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := client.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: img, Spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1, Resolution: 96}})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("submit: %v\nlogs:\n%s", err, logs.String())
		}
	}
	peak := peakRSS(t, cmd.Process.Pid)
	t.Logf("daemon peak RSS after 20 concurrent 36 MP uploads: %d MiB (bound %d MiB)", peak>>20, maxBurstRSS>>20)
	if peak > maxBurstRSS {
		t.Errorf("peak RSS %d MiB, bound %d MiB", peak>>20, maxBurstRSS>>20)
	}

	// Over the pixel limit: refused before decoding, saying which flag sets the limit.
	stop(t, cmd, logs)
	_, logs, conn = f.start(t, "--lanes", "cpu", "--max-image-pixels", "1000000")
	_, err := framepackv1.NewJobServiceClient(conn).SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: img, Spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1, Resolution: 96}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-image-pixels") || !strings.Contains(err.Error(), "6000x6000") {
		t.Fatalf("36 MP image with a 1 MP limit: %v", err)
	}
}
