package gpuversion

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  Version
		want string
	}{
		{"cuda 12.4", FromCUDA(12040), "12.4"},
		{"cuda 11.8", FromCUDA(11080), "11.8"},
		{"cuda 13.0", FromCUDA(13000), "13.0"},
		{"hip 6.4", FromHIP(60443484), "6.4.43484"},
		{"hip 6.1", FromHIP(60140091), "6.1.40091"},
		{"unknown", FromCUDA(0), ""},
		{"amdgpu of rocm 6.1", ROCmOfAMDGPU(Version{6, 7, 0}), "6.1"},
		{"amdgpu of rocm 6.2", ROCmOfAMDGPU(Version{6, 8, 5}), "6.2"},
		{"amdgpu of rocm 6.4", ROCmOfAMDGPU(Version{6, 12, 12}), "6.4"},
		{"amdgpu before 6.0", ROCmOfAMDGPU(Version{5, 18, 13}), ""},
		{"amdgpu past the table", ROCmOfAMDGPU(Version{6, 14, 14}), ""},
	} {
		if tc.got.String() != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	if _, err := Parse("6.x"); err == nil {
		t.Error("Parse 6.x: no error")
	}
	if v, err := Parse("v12.8.1"); err != nil || v != (Version{12, 8, 1}) {
		t.Errorf("Parse v12.8.1: %v %v", v, err)
	}
}

// TestCheck: runtimes newer than the driver serves and the known-bad ROCm pair are refused
// with both versions and the fix named; equal, older and unknown pass.
func TestCheck(t *testing.T) {
	v := func(s string) Version {
		x, err := Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	for _, tc := range []struct {
		name                     string
		backend, runtime, driver string
		want                     []string // empty: no mismatch
	}{
		{"rocm 6.4 on 6.1", "hip", "6.4.43484", "6.1", []string{"known-bad", "runtime 6.4.43484", "serves 6.1", "ROCM_VERSION=6.1", "ROCm 6.4's amdgpu driver"}},
		{"rocm 6.3 on 6.2", "hip", "6.3.1", "6.2", []string{"newer than the host driver serves", "6.3.1", "6.2"}},
		{"rocm 6.2 on 6.4", "hip", "6.2.0", "6.4", nil},
		{"rocm same", "hip", "6.1.2", "6.1", nil},
		{"cuda 12.8 on 12.4", "cuda", "12.8", "12.4", []string{"CUDA runtime 12.8", "serves 12.4", "supports CUDA 12.8", "CUDA_VERSION=12.4.0"}},
		{"cuda 13.0 on 12.9", "cuda", "13.0", "12.9", []string{"newer"}},
		{"cuda 12.4 on 12.8", "cuda", "12.4", "12.8", nil},
		{"driver unknown", "cuda", "12.8", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs := Versions{Backend: tc.backend, Runtime: v(tc.runtime), RuntimeSource: "test", DriverSource: "test"}
			if tc.driver != "" {
				vs.Driver = v(tc.driver)
			}
			err := Check(vs)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("mismatch %v", err)
				}
				return
			}
			var m *Mismatch
			if !errors.As(err, &m) {
				t.Fatalf("no mismatch: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
		})
	}
}

func TestRead(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	// This machine (CI: no GPU libraries): versions unknown, sources say why, no error.
	for _, backend := range []string{"cuda", "hip"} {
		v, ok, err := Read(backend, Options{Getenv: getenv, SysRoot: t.TempDir()})
		if err != nil || !ok || v.Backend != backend || v.RuntimeSource == "" || v.DriverSource == "" {
			t.Fatalf("%s: %+v %v %v", backend, v, ok, err)
		}
		t.Logf("%s on this machine: %s (check: %v)", backend, v.Describe(), Check(v))
	}
	if _, ok, _ := Read("cpu", Options{Getenv: getenv}); ok {
		t.Fatal("cpu has versions")
	}
	env[EnvFake] = "hip:6.4.1/6.1"
	v, ok, err := Read("cpu", Options{Getenv: getenv})
	if err != nil || !ok || v.Backend != "hip" || v.Runtime != (Version{6, 4, 1}) || v.Driver != (Version{6, 1, 0}) {
		t.Fatalf("fake: %+v %v %v", v, ok, err)
	}
	env[EnvFake] = "tpu:1/2"
	if _, _, err := Read("cuda", Options{Getenv: getenv}); err == nil {
		t.Fatal("bad fake accepted")
	}
}

func TestAMDGPUDriver(t *testing.T) {
	root := t.TempDir()
	if v, src := AMDGPUDriver(root); v.Known() || !strings.Contains(src, "in-kernel") {
		t.Fatalf("no module version: %v %s", v, src)
	}
	p := filepath.Join(root, "sys", "module", "amdgpu")
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "version"), []byte("6.7.0-1781449.22.04\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, src := AMDGPUDriver(root); v != (Version{6, 1, 0}) || !strings.Contains(src, "6.7.0-1781449.22.04 = ROCm 6.1") {
		t.Fatalf("rocm 6.1 driver: %v %s", v, src)
	}
}
