package devices

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

// ---- amdgpu sysfs ------------------------------------------------------------------------

// kfdProps is a real kfd node properties file (RX 6800 XT, kernel 6.8) with the values a test
// changes substituted.
func kfdProps(cpuCores, simd, gfx, domain, loc, deviceID uint64) string {
	return fmt.Sprintf(`cpu_cores_count %d
simd_count %d
mem_banks_count 1
caches_count 150
io_links_count 1
p2p_links_count 0
cpu_core_id_base 0
simd_id_base 2147487744
max_waves_per_simd 16
lds_size_in_kb 64
gds_size_in_kb 0
num_gws 64
wave_front_size 32
array_count 8
simd_arrays_per_engine 2
cu_per_simd_array 10
simd_per_cu 2
max_slots_scratch_cu 32
gfx_target_version %d
vendor_id 4098
device_id %d
location_id %d
domain %d
drm_render_minor 128
hive_id 0
num_sdma_engines 2
num_sdma_xgmi_engines 0
num_sdma_queues_per_engine 8
num_cp_queues 8
max_engine_clk_fcompute 2575
local_mem_size 0
fw_version 118
capability 671588992
debug_prop 1495
sdma_fw_version 83
unique_id 9381716497318434852
num_xcc 1
max_engine_clk_ccompute 4464
`, cpuCores, simd, gfx, deviceID, loc, domain)
}

type fakeGPU struct {
	node                int
	cpuCores, simd, gfx uint64
	domain, bus         uint64
	deviceID            uint64
	vramTotal, vramUsed uint64
	gttTotal, gttUsed   uint64
	product             string
	noPCI               bool
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeSysfs writes the kfd topology and PCI device files of gpus (plus a CPU node 0) under a
// temporary root, laid out as amdgpu does.
func fakeSysfs(t *testing.T, gpus []fakeGPU) string {
	root := t.TempDir()
	writeFile(t, filepath.Join(root, kfdNodes, "0", "properties"), kfdProps(16, 0, 0, 0, 0, 0))
	writeFile(t, filepath.Join(root, kfdNodes, "0", "name"), "\n")
	writeFile(t, filepath.Join(root, "sys/module/amdgpu/version"), "6.8.5\n")
	for _, g := range gpus {
		loc := g.bus << 8
		writeFile(t, filepath.Join(root, kfdNodes, strconv.Itoa(g.node), "properties"),
			kfdProps(g.cpuCores, g.simd, g.gfx, g.domain, loc, g.deviceID))
		writeFile(t, filepath.Join(root, kfdNodes, strconv.Itoa(g.node), "gpu_id"), "45716\n")
		if g.noPCI {
			continue
		}
		dir := filepath.Join(root, pciDevices, busIDOf(g.domain, loc))
		writeFile(t, filepath.Join(dir, "vendor"), "0x1002\n")
		writeFile(t, filepath.Join(dir, "device"), fmt.Sprintf("0x%04x\n", g.deviceID))
		writeFile(t, filepath.Join(dir, "class"), "0x030000\n")
		writeFile(t, filepath.Join(dir, "mem_info_vram_total"), fmt.Sprintf("%d\n", g.vramTotal))
		writeFile(t, filepath.Join(dir, "mem_info_vram_used"), fmt.Sprintf("%d\n", g.vramUsed))
		writeFile(t, filepath.Join(dir, "mem_info_gtt_total"), fmt.Sprintf("%d\n", g.gttTotal))
		writeFile(t, filepath.Join(dir, "mem_info_gtt_used"), fmt.Sprintf("%d\n", g.gttUsed))
		writeFile(t, filepath.Join(dir, "mem_info_vis_vram_total"), "268435456\n")
		if g.product != "" {
			writeFile(t, filepath.Join(dir, "product_name"), g.product+"\n")
		}
	}
	return root
}

const gib = 1 << 30

var threeAMD = []fakeGPU{
	// node numbers and bus order deliberately disagree: matching must be by bus id
	{node: 1, simd: 120, gfx: 100300, bus: 0x0c, deviceID: 0x73bf, vramTotal: 16 * gib, vramUsed: 512 << 20,
		gttTotal: 32 * gib, gttUsed: 20 << 20, product: "AMD Radeon RX 6800 XT"},
	{node: 2, simd: 440, gfx: 90010, domain: 1, bus: 0x43, deviceID: 0x740c, vramTotal: 64 * gib,
		vramUsed: 10 << 20, gttTotal: 256 * gib},
	// a Strix Halo APU: a small carve-out, most memory through GTT
	{node: 3, simd: 80, gfx: 110501, bus: 0xc5, deviceID: 0x1586, vramTotal: 512 << 20, vramUsed: 300 << 20,
		gttTotal: 96 * gib, gttUsed: 2 * gib},
}

func TestListAMD(t *testing.T) {
	root := fakeSysfs(t, threeAMD)
	devs, err := ListAMD(t.Context(), Options{SysRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Backend: BackendHIP, Index: 0, Name: "AMD Radeon RX 6800 XT", Arch: "gfx1030", PCIBusID: "0000:0c:00.0",
			TotalBytes: 16 * gib, UsedBytes: 512 << 20, VRAMTotal: 16 * gib, VRAMUsed: 512 << 20, GTTTotal: 32 * gib,
			GTTUsed: 20 << 20, Driver: "amdgpu 6.8.5"},
		{Backend: BackendHIP, Index: 1, Name: "AMD GPU 0x740c", Arch: "gfx90a", PCIBusID: "0001:43:00.0",
			TotalBytes: 64 * gib, UsedBytes: 10 << 20, VRAMTotal: 64 * gib, VRAMUsed: 10 << 20, GTTTotal: 256 * gib,
			Driver: "amdgpu 6.8.5"},
		{Backend: BackendHIP, Index: 2, Name: "AMD GPU 0x1586", Arch: "gfx1151", PCIBusID: "0000:c5:00.0",
			TotalBytes: 512<<20 + 96*gib, UsedBytes: 300<<20 + 2*gib, VRAMTotal: 512 << 20, VRAMUsed: 300 << 20,
			GTTTotal: 96 * gib, GTTUsed: 2 * gib, Unified: true, Driver: "amdgpu 6.8.5"},
	}
	if len(devs) != len(want) {
		t.Fatalf("got %d devices, want %d: %+v", len(devs), len(want), devs)
	}
	for i := range want {
		if devs[i] != want[i] {
			t.Errorf("device %d:\n got %+v\nwant %+v", i, devs[i], want[i])
		}
	}

	// the reader follows the driver's figures; unified devices count GTT too
	r, err := NewReader(devs[2], Options{SysRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, pciDevices, "0000:c5:00.0")
	writeFile(t, filepath.Join(dir, "mem_info_gtt_used"), fmt.Sprintf("%d\n", 40*gib))
	used, err := r.Used(t.Context())
	if err != nil || used != 300<<20+40*gib {
		t.Fatalf("apu used %d (%v), want %d", used, err, 300<<20+40*gib)
	}
	if got, err := UsedBytes(t.Context(), devs[0], Options{SysRoot: root}); err != nil || got != 512<<20 {
		t.Fatalf("UsedBytes %d (%v)", got, err)
	}
	os.Remove(filepath.Join(dir, "mem_info_vram_used"))
	if _, err := r.Used(t.Context()); err == nil {
		t.Fatal("reader of a vanished device: no error")
	}
}

func TestListAMDBroken(t *testing.T) {
	tests := []struct {
		name    string
		gpus    []fakeGPU
		noKFD   bool
		wantErr error
	}{
		{name: "no amdgpu driver", noKFD: true, wantErr: ErrNoDevices},
		{name: "cpu nodes only", gpus: nil, wantErr: ErrNoDevices},
		{name: "kfd node without its pci device", gpus: []fakeGPU{{node: 1, simd: 60, gfx: 110000, bus: 3, noPCI: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if !tc.noKFD {
				root = fakeSysfs(t, tc.gpus)
			}
			_, err := ListAMD(t.Context(), Options{SysRoot: root})
			if err == nil {
				t.Fatal("no error")
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("got %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestGfxArch(t *testing.T) {
	for v, want := range map[uint64]string{100300: "gfx1030", 90010: "gfx90a", 110501: "gfx1151", 90402: "gfx942",
		110000: "gfx1100", 110001: "gfx1101", 0: ""} {
		if got := gfxArch(v); got != want {
			t.Errorf("gfxArch(%d) = %q, want %q", v, got, want)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{"00000000:3B:00.0": "0000:3b:00.0", "0000:03:00.0": "0000:03:00.0",
		"03:00.0": "0000:03:00.0", "00000001:C5:00.1": "0001:c5:00.1"} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}

// ---- NVML ------------------------------------------------------------------------------

// buildFakeNVML compiles testdata/fake_nvml.c into a shared library.
func buildFakeNVML(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc to build the fake NVML library")
	}
	out := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	raw, err := exec.CommandContext(t.Context(), cc, "-shared", "-fPIC", "-O1", "-o", out, "testdata/fake_nvml.c").CombinedOutput()
	if err != nil {
		t.Fatalf("build fake nvml: %v\n%s", err, raw)
	}
	return out
}

func TestListNVML(t *testing.T) {
	lib := buildFakeNVML(t)
	usedFile := filepath.Join(t.TempDir(), "used")
	writeFile(t, usedFile, "1048576000\n")
	t.Setenv("FAKE_NVML_USED_FILE", usedFile)
	opts := Options{NVMLPath: lib, SysRoot: t.TempDir()}
	devs, err := List(t.Context(), "auto", opts) // no AMD in the empty sysfs: NVIDIA only
	if err != nil {
		t.Fatal(err)
	}
	want := []Device{
		{Backend: BackendCUDA, Index: 0, Name: "NVIDIA H100 80GB HBM3", Arch: "sm_90", PCIBusID: "0000:3b:00.0",
			TotalBytes: 85520809984, UsedBytes: 1048576000, Driver: "580.159.04"},
		{Backend: BackendCUDA, Index: 1, Name: "NVIDIA A100-SXM4-40GB", Arch: "sm_80", PCIBusID: "0000:86:00.0",
			TotalBytes: 42949672960, UsedBytes: 4194304, Driver: "580.159.04"},
	}
	if len(devs) != 2 || devs[0] != want[0] || devs[1] != want[1] {
		t.Fatalf("devices\n got %+v\nwant %+v", devs, want)
	}
	r, err := NewReader(devs[0], opts)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, usedFile, "43000000000\n")
	if used, err := r.Used(t.Context()); err != nil || used != 43000000000 {
		t.Fatalf("used %d (%v), want 43000000000", used, err)
	}
	if r.Name() != "nvml 0000:3b:00.0" {
		t.Fatalf("reader name %q", r.Name())
	}
	gone := devs[0]
	gone.PCIBusID = "0000:99:00.0"
	if _, err := UsedBytes(t.Context(), gone, opts); !errors.Is(err, ErrNoDevices) {
		t.Fatalf("device not on the bus: got %v, want ErrNoDevices", err)
	}
}

func TestListNVMLMissing(t *testing.T) {
	if _, err := ListNVML(t.Context(), Options{NVMLPath: filepath.Join(t.TempDir(), "libnvidia-ml.so.1")}); !errors.Is(err, ErrNoDevices) {
		t.Fatalf("missing library: got %v, want ErrNoDevices", err)
	}
	lib := buildFakeNVML(t)
	t.Setenv("FAKE_NVML_INIT", "9") // NVML_ERROR_DRIVER_NOT_LOADED
	if _, err := ListNVML(t.Context(), Options{NVMLPath: lib}); !errors.Is(err, ErrNoDevices) {
		t.Fatalf("driver not loaded: got %v, want ErrNoDevices", err)
	}
	if _, err := List(t.Context(), "cuda", Options{NVMLPath: lib}); !errors.Is(err, ErrNoDevices) {
		t.Fatalf("List cuda without a driver: got %v", err)
	}
	if _, err := List(t.Context(), "metal", Options{}); err == nil {
		t.Fatal("unknown backend: no error")
	}
}

func TestReaderBackends(t *testing.T) {
	if _, err := NewReader(Device{Backend: "cpu"}, Options{}); err == nil {
		t.Fatal("cpu reader: no error")
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	r, _ := NewReader(Device{Backend: BackendHIP, PCIBusID: "0000:03:00.0"}, Options{SysRoot: t.TempDir()})
	if _, err := r.Used(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled read: %v", err)
	}
}
