package modelrt_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// fakeBackends builds internal/runtime's fake backend library as dir/libfpk-cuda.so and
// dir/libfpk-hip.so, each recording the device and PCI bus id it is created for in
// dir/<backend>.record; it returns the module root.
func fakeBackends(t *testing.T, dir string) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the test backend library")
	}
	root, err := parity.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	rtDir := filepath.Join(root, "internal", "runtime")
	for _, b := range []string{"cuda", "hip"} {
		out := filepath.Join(dir, "libfpk-"+b+".so")
		args := []string{"-shared", "-fPIC", "-O1", "-std=gnu11", "-I" + rtDir, "-o", out,
			filepath.Join(rtDir, "testdata", "fake_backend.c"), "-lm", fmt.Sprintf(`-DRECORD_PATH="%s"`, filepath.Join(dir, b+".record"))}
		if raw, err := exec.CommandContext(t.Context(), cc, args...).CombinedOutput(); err != nil {
			t.Fatalf("build fake %s backend: %v\n%s", b, err, raw)
		}
	}
	return root
}

// TestOpenLaneDevice: a worker of each kind, as a real process, opens the backend and
// device its LoadRequest names (as a lane names them: backend, index, PCI bus id), and "auto"
// the first GPU backend that opens; the backend libraries are a fake that records what it was
// opened for (it cannot run the models, so a load may fail after the device is open).
func TestOpenLaneDevice(t *testing.T) { // short names: the test temp dir holds the worker sockets
	dir := t.TempDir()
	root := fakeBackends(t, dir)
	models := filepath.Join(root, "testdata", "parity", "models")
	workers := map[string]string{
		"textenc":     filepath.Join(models, "hunyuanvideo"),
		"vae":         filepath.Join(models, "hunyuanvideo", "vae"),
		"clipvision":  filepath.Join(models, "flux_redux_bfl"),
		"transformer": filepath.Join(models, "framepack_i2v"),
	}
	for _, tc := range []struct {
		name, backend string
		index         uint32
		bus           string
		record        string // the library that must open, and what it records
		want          string
	}{
		{name: "cuda", backend: "cuda", index: 1, bus: "0000:65:00.0", record: "cuda", want: "device=1 pci_bus_id=0000:65:00.0"},
		{name: "hip", backend: "hip", index: 2, record: "hip", want: "device=2 pci_bus_id="},
		{name: "auto", backend: "auto", record: "cuda", want: "device=0 pci_bus_id="},
	} {
		for name, modelDir := range workers {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				for _, b := range []string{"cuda", "hip"} {
					_ = os.Remove(filepath.Join(dir, b+".record"))
				}
				p, _ := workertest.Start(t, name, "FRAMEPACK_NATIVE_DIR="+dir)
				resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: modelDir, Backend: tc.backend,
					DeviceIndex: tc.index, PCIBusID: tc.bus})
				got, rerr := os.ReadFile(filepath.Join(dir, tc.record+".record"))
				if rerr != nil || strings.TrimSpace(string(got)) != tc.want {
					t.Fatalf("the %s worker opened %q (%v) of the %s backend, want %q; load: %+v, %v", name, got, rerr, tc.record, tc.want, resp, err)
				}
				if err == nil && (resp.Device == nil || resp.Device.Index != tc.index || resp.Device.Name != fmt.Sprintf("fake device %d", tc.index)) {
					t.Errorf("the %s worker loaded on %+v, want the fake's device %d", name, resp.Device, tc.index)
				}
				t.Logf("%s on %s: load %v", name, tc.backend, err)
			})
		}
	}
}

// TestWorkersDeclareTraits: each worker, as a real process, declares in its LoadResponse what a
// retry can change (workerkit.ModelTraits): its stack of blocks and their number, whether it
// convolves and tiles, and, loaded at f32 on a GPU, its own 16-bit dtype as the fallback; on
// the cpu no fallback.
func TestWorkersDeclareTraits(t *testing.T) {
	dir := t.TempDir()
	root := fakeBackends(t, dir)
	models := filepath.Join(root, "testdata", "parity", "models")
	for _, tc := range []struct {
		worker, dir, stack, fallback string
		convolves, tiles             bool
	}{
		{worker: "textenc", dir: "hunyuanvideo", stack: "llama layers", fallback: "fp16"},
		{worker: "vae", dir: "hunyuanvideo/vae", convolves: true, tiles: true, fallback: "fp16"},
		{worker: "clipvision", dir: "flux_redux_bfl", convolves: true, fallback: "fp16"},
		{worker: "transformer", dir: "framepack_i2v", stack: "transformer blocks", convolves: true, fallback: "bf16"},
	} {
		for _, backend := range []string{"cuda", "cpu"} {
			t.Run(tc.worker+"/"+backend, func(t *testing.T) {
				p, _ := workertest.Start(t, tc.worker, "FRAMEPACK_NATIVE_DIR="+dir, "FRAMEPACK_ACTIVATION_DTYPE=f32")
				resp, err := p.Load(workertest.Ctx(t), &workerkit.LoadRequest{ModelDir: filepath.Join(models, tc.dir), Backend: backend})
				if err != nil {
					t.Fatal(err)
				}
				tr := resp.Traits
				if tr == nil {
					t.Fatal("no traits in the LoadResponse")
				}
				if tr.BlockStack != tc.stack || tr.Convolves != tc.convolves || tr.Tiles != tc.tiles {
					t.Errorf("traits %+v", tr)
				}
				if n := resp.ResidentBlocks + resp.StreamedBlocks; tr.Blocks != n || (tc.stack != "") != (n > 0) {
					t.Errorf("a stack of %d blocks, %d resident and %d streamed", tr.Blocks, resp.ResidentBlocks, resp.StreamedBlocks)
				}
				want := []string{tc.fallback}
				if backend == "cpu" {
					want = nil
				}
				if fmt.Sprint(tr.FallbackDTypes) != fmt.Sprint(want) || resp.DType != "fp32" {
					t.Errorf("loaded %s with fallback dtypes %v, want fp32 with %v", resp.DType, tr.FallbackDTypes, want)
				}
			})
		}
	}
}
