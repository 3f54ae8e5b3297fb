package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestDaemonSystemdNotify runs the daemon as systemd would (NOTIFY_SOCKET, WATCHDOG_USEC): it
// says READY=1 with the lanes' health once it serves, pings WATCHDOG=1 while it runs, says
// STOPPING=1 on SIGTERM; ListDevices shows the lane's state.
func TestDaemonSystemdNotify(t *testing.T) {
	f := newFixture(t)
	f.withModels(t) // a serving daemon: its lanes' own states show
	sock := filepath.Join(f.dir, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "400000")
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
	cmd, logs, conn := f.start(t, "--backend", "cpu")
	next := func(what string) string {
		select {
		case m := <-msgs:
			return m
		case <-time.After(10 * time.Second):
			t.Fatalf("no %s message\nlogs:\n%s", what, logs.String())
			return ""
		}
	}
	if m := next("READY"); m != "READY=1\nSTATUS=cpu healthy" {
		t.Fatalf("first message %q", m)
	}
	pings := 0
	for pings < 3 {
		if m := next("WATCHDOG"); strings.HasPrefix(m, "WATCHDOG=1") {
			pings++
		}
	}
	resp, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.GetDevices(); len(d) != 1 || d[0].GetLaneState() != framepackv1.LaneState_LANE_STATE_HEALTHY {
		t.Fatalf("devices %v", d)
	}
	stop(t, cmd, logs)
	for {
		select {
		case m := <-msgs:
			if m == "STOPPING=1" {
				return
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no STOPPING=1 after SIGTERM\nlogs:\n%s", logs.String())
		}
	}
}
