package faults

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/workerkit"
)

func newBeacon(t *testing.T) (*beacon.Page, *beacon.Writer) {
	t.Helper()
	p, err := beacon.NewPage()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	w, err := beacon.Attach(p.File())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return p, w
}

func TestInjectorFiresAtItsOp(t *testing.T) {
	tests := []struct {
		name     string
		fault    workerkit.Fault
		wantExit syscall.Signal
		wantHang bool
		wantOOM  bool
	}{
		{name: "exit default signal", fault: workerkit.Fault{ExitAtOp: 3}, wantExit: syscall.SIGKILL},
		{name: "exit abort", fault: workerkit.Fault{ExitAtOp: 3, ExitSignal: int32(syscall.SIGABRT)}, wantExit: syscall.SIGABRT},
		{name: "hang", fault: workerkit.Fault{HangAtOp: 3}, wantHang: true},
		{name: "oom", fault: workerkit.Fault{OOMAtOp: 3}, wantOOM: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			page, bw := newBeacon(t)
			in, err := New(&tc.fault, Caps{}, bw, nil)
			if err != nil {
				t.Fatal(err)
			}
			var exited syscall.Signal
			hung := false
			in.exit = func(sig syscall.Signal) { exited = sig }
			in.hang = func() { hung = true }
			for i := uint64(1); i <= 5; i++ {
				if i == 2 {
					if in.BeginOp("conv3d", "k", "vendor_tuned", 99) != 2 {
						t.Fatal("op number is not the beacon's")
					}
				} else {
					in.BeginOp("gemm", "", "", 99)
				}
				if i == 2 {
					snap, _ := page.Snapshot()
					if snap.ConvKey != "k" || snap.ConvTier != "vendor_tuned" {
						t.Fatalf("conv fields not on the beacon: %+v", snap)
					}
				}
				in.EndOp()
				if i < 3 && (exited != 0 || hung || in.Err() != nil) {
					t.Fatalf("fired before its op (op %d)", i)
				}
			}
			if exited != tc.wantExit || hung != tc.wantHang {
				t.Fatalf("exit %v hang %v, want %v %v", exited, hung, tc.wantExit, tc.wantHang)
			}
			err = in.Err()
			if tc.wantOOM {
				var we *workerkit.Error
				if !errors.As(err, &we) || we.Code != workerkit.CodeOutOfMemory || we.RequestedBytes != InjectedOOMBytes {
					t.Fatalf("injected oom: %v", err)
				}
			} else if err != nil {
				t.Fatalf("unexpected oom: %v", err)
			}
		})
	}
}

func TestInjectorWithoutBeaconCountsRuntimeOps(t *testing.T) {
	in, err := New(&workerkit.Fault{OOMAtOp: 7}, Caps{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := in.BeginOp("gemm", "", "", 6); got != 6 || in.Err() != nil {
		t.Fatalf("op 6: %d %v", got, in.Err())
	}
	in.BeginOp("gemm", "", "", 7)
	if in.Err() == nil {
		t.Fatal("no oom at runtime op 7")
	}
	var nilIn *Injector
	if nilIn.BeginOp("x", "", "", 4) != 4 || nilIn.Err() != nil {
		t.Fatal("nil injector")
	}
}

// TestInjectorOpErr: OpErr fails only the runtime op at which oom_at_op armed, once, with the
// op's sizes; Err then reports the same error.
func TestInjectorOpErr(t *testing.T) {
	_, bw := newBeacon(t)
	in, err := New(&workerkit.Fault{OOMAtOp: 3}, Caps{}, bw, nil)
	if err != nil {
		t.Fatal(err)
	}
	for rt := uint64(11); rt <= 13; rt++ {
		in.BeginOp("gemm", "", "", rt)
		if rt < 13 && in.OpErr(rt, 100, 50, 1000) != nil {
			t.Fatalf("runtime op %d failed before the fault's op", rt)
		}
	}
	if in.OpErr(12, 100, 50, 1000) != nil {
		t.Fatal("an op other than the armed one failed")
	}
	err = in.OpErr(13, 100, 50, 1000)
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeOutOfMemory || we.RequestedBytes != 100 || we.AvailableBytes != 950 {
		t.Fatalf("op 3: %v", err)
	}
	if in.OpErr(13, 100, 50, 1000) != nil {
		t.Fatal("the op failed twice")
	}
	if got := in.Err(); got != error(we) {
		t.Fatalf("Err after OpErr: %v, want the op's error", got)
	}
	var nilIn *Injector
	if nilIn.OpErr(1, 0, 0, 0) != nil {
		t.Fatal("nil injector")
	}
	// no output and no cap: the default request, nothing available
	in2, _ := New(&workerkit.Fault{OOMAtOp: 1}, Caps{}, nil, nil)
	in2.BeginOp("fill", "", "", 1)
	if !errors.As(in2.OpErr(1, 0, 10, 0), &we) || we.RequestedBytes != InjectedOOMBytes || we.AvailableBytes != 0 {
		t.Fatalf("defaults: %+v", we)
	}
}

func TestNewRefuses(t *testing.T) {
	t.Setenv(EnvFakeVRAMDir, "")
	for name, f := range map[string]workerkit.Fault{
		"conv hang without convs": {HangConvTier: workerkit.ConvTierOwnKernel},
		"bad signal":              {ExitAtOp: 1, ExitSignal: 99},
		"vram without ledger":     {HoldVRAMBytes: 1 << 20, HoldVRAMSeconds: 1},
	} {
		if _, err := New(&f, Caps{}, nil, nil); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := New(&workerkit.Fault{HangConvTier: 9}, Caps{Conv: true}, nil, nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("tier 9: %v", err)
	}
	if _, err := New(&workerkit.Fault{HangConvTier: workerkit.ConvTierVendorTuned}, Caps{Conv: true}, nil, nil); err != nil {
		t.Errorf("conv hang with convs: %v", err)
	}
}

// TestLedger: memory held by a living process counts; after it dies it counts for the hold
// time, then the entry is gone.
func TestLedger(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "vram")
	l, err := NewLedger(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := HoldFakeVRAM(dir, cmd.Process.Pid, 3<<20, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := HoldFakeVRAM(dir, os.Getpid(), 1<<20, 0); err != nil {
		t.Fatal(err)
	}
	used := func() uint64 {
		t.Helper()
		u, err := l.Used()
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	if u := used(); u != 4<<20 {
		t.Fatalf("while alive: %d", u)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if u := used(); u != 4<<20 {
		t.Fatalf("just after exit (held on): %d", u)
	}
	now = now.Add(1900 * time.Millisecond)
	if u := used(); u != 4<<20 {
		t.Fatalf("within the hold: %d", u)
	}
	now = now.Add(200 * time.Millisecond)
	if u := used(); u != 1<<20 {
		t.Fatalf("after the hold: %d", u)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("expired entry not removed: %v", ents)
	}
}
