package devices

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/runtime"
)

// These tests need an NVIDIA GPU and the cuda backend library; they run on the device machine
// (scripts/gpu-check.sh sets FRAMEPACK_BACKEND=cuda) and skip elsewhere.

const (
	envAllocChild = "FRAMEPACK_DEVICES_TEST_ALLOC" // bytes the helper process allocates
	returnLimit   = 2 * time.Second                // the bound on memory coming back
	returnMargin  = 256 << 20
)

func needCUDA(t *testing.T) Device {
	t.Helper()
	if os.Getenv(runtime.EnvBackend) != "cuda" {
		t.Skip("needs FRAMEPACK_BACKEND=cuda and an NVIDIA GPU")
	}
	devs, err := ListNVML(t.Context(), Options{})
	if err != nil {
		t.Fatalf("nvml on a cuda machine: %v", err)
	}
	return devs[0]
}

// TestNVMLReal lists the machine's GPUs as the probe worker would.
func TestNVMLReal(t *testing.T) {
	dev := needCUDA(t)
	devs, err := List(t.Context(), "auto", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		t.Logf("device %d: %s, %s, bus %s, %d of %d bytes used, driver %s", d.Index, d.Name, d.Arch, d.PCIBusID,
			d.UsedBytes, d.TotalBytes, d.Driver)
		if d.TotalBytes == 0 || d.Name == "" || !strings.HasPrefix(d.Arch, "sm_") || d.PCIBusID == "" {
			t.Errorf("incomplete device %+v", d)
		}
	}
	if _, err := UsedBytes(t.Context(), dev, Options{}); err != nil {
		t.Fatal(err)
	}
}

// TestVRAMAllocHelper is the child of TestVRAMReturnedAfterKill: a cuda runtime that allocates
// and touches the bytes asked for, says "ready" and waits to be killed.
func TestVRAMAllocHelper(t *testing.T) {
	n, err := strconv.ParseInt(os.Getenv(envAllocChild), 10, 64)
	if err != nil || n <= 0 {
		t.Skip("helper process only")
	}
	rt, err := runtime.New(runtime.Options{Backend: "cuda"})
	if err != nil {
		t.Fatal(err)
	}
	x, err := rt.NewTensor(runtime.U8, int(n))
	if err != nil {
		t.Fatal(err)
	}
	if err := x.Fill(1); err != nil {
		t.Fatal(err)
	}
	if err := rt.Synchronize(); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("ready\n")
	time.Sleep(time.Hour)
}

// TestVRAMReturnedAfterKill: a cuda worker process holding 40 GB is killed (SIGKILL, as the
// watchdog does) and NVML's used figure is back at the baseline within 2 s.
func TestVRAMReturnedAfterKill(t *testing.T) {
	dev := needCUDA(t)
	alloc := int64(40e9)
	if dev.TotalBytes < uint64(alloc)+4<<30 {
		alloc = int64(dev.TotalBytes / 2)
	}
	r, err := NewReader(dev, Options{})
	if err != nil {
		t.Fatal(err)
	}
	base, err := r.Used(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestVRAMAllocHelper$", "-test.v")
	cmd.Env = append(os.Environ(), envAllocChild+"="+strconv.FormatInt(alloc, 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				ready <- true
				return
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if !ok {
			cmd.Wait()
			t.Fatal("helper exited before allocating")
		}
	case <-time.After(2 * time.Minute):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		t.Fatal("helper did not allocate in time")
	}
	held, err := r.Used(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if held < base+uint64(alloc)*9/10 {
		t.Fatalf("nvml shows %d bytes used while the worker holds %d (baseline %d)", held, alloc, base)
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	cmd.Wait()
	var used uint64
	for {
		used, err = r.Used(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if used <= base+returnMargin || time.Since(killed) > 10*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	back := time.Since(killed)
	t.Logf("baseline %d, held %d (+%d), after kill %d: back in %v (bound %v)", base, held, held-base, used,
		back.Round(time.Millisecond), returnLimit)
	if used > base+returnMargin || back > returnLimit {
		t.Fatalf("memory not returned within %v: %d bytes used after %v, baseline %d", returnLimit, used, back, base)
	}
}
