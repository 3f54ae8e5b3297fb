package watchdog

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestNotifier: READY and STATUS reach the notify socket; WATCHDOG pings come at half of
// WATCHDOG_USEC while the main loop is healthy, stop while it is not, and resume.
func TestNotifier(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "100000")
	msgs := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := l.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	n := NewNotifier(quietLog())
	if err := n.Ready("serving"); err != nil {
		t.Fatal(err)
	}
	if m := <-msgs; m != "READY=1\nSTATUS=serving" {
		t.Fatalf("ready message %q", m)
	}
	var healthy atomic.Bool
	healthy.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- n.Run(ctx, func(context.Context) error {
			if healthy.Load() {
				return nil
			}
			return errors.New("queue loop stuck")
		}, func() string { return "cpu healthy" })
	}()
	count := func(d time.Duration) (pings int, first string) {
		deadline := time.After(d)
		for {
			select {
			case m := <-msgs:
				if strings.HasPrefix(m, "WATCHDOG=1") {
					if pings == 0 {
						first = m
					}
					pings++
				}
			case <-deadline:
				return
			}
		}
	}
	if p, first := count(300 * time.Millisecond); p < 3 || first != "WATCHDOG=1\nSTATUS=cpu healthy" {
		t.Fatalf("healthy: %d pings, first %q", p, first)
	}
	healthy.Store(false)
	count(60 * time.Millisecond) // a ping already on its way
	if p, _ := count(300 * time.Millisecond); p != 0 {
		t.Fatalf("unhealthy: %d pings", p)
	}
	healthy.Store(true)
	if p, first := count(300 * time.Millisecond); p < 3 || first != "WATCHDOG=1" {
		t.Fatalf("healthy again: %d pings, first %q", p, first)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	t.Setenv("WATCHDOG_USEC", "")
	if err := n.Run(t.Context(), nil, nil); err != nil {
		t.Fatalf("without a systemd watchdog: %v", err)
	}
	w1, _ := New(Config{Lane: "cpu"})
	defer w1.Close()
	w1.Health().Hold("vram")
	if s := LanesStatus([]*Watchdog{w1}); s != "cpu held: vram" {
		t.Fatalf("status %q", s)
	}
}
