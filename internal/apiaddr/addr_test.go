package apiaddr

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Addr
		wantErr bool
	}{
		{in: "unix:///run/user/1000/framepackd.sock", want: Addr{Network: "unix", Address: "/run/user/1000/framepackd.sock"}},
		{in: "unix:rel/x.sock", want: Addr{Network: "unix", Address: "rel/x.sock"}},
		{in: "/tmp/a.sock", want: Addr{Network: "unix", Address: "/tmp/a.sock"}},
		{in: "x.sock", want: Addr{Network: "unix", Address: "x.sock"}},
		{in: "tcp://127.0.0.1:7070", want: Addr{Network: "tcp", Address: "127.0.0.1:7070"}},
		{in: "tcp://[::1]:7070", want: Addr{Network: "tcp", Address: "[::1]:7070"}},
		{in: "tcp://localhost", wantErr: true},
		{in: "tcp://h:99999", wantErr: true},
		{in: "http://x:1", wantErr: true},
		{in: "localhost:7070", wantErr: true},
		{in: "unix://", wantErr: true},
	} {
		got, err := ParseAddr(tc.in)
		if (err != nil) != tc.wantErr || (!tc.wantErr && got != tc.want) {
			t.Errorf("ParseAddr(%q) = %v, %v", tc.in, got, err)
		}
	}
}

func TestDefaultSocketPath(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", "/run/user/4242")
	if got := DefaultSocketPath(); got != "/run/user/4242/framepackd.sock" {
		t.Fatalf("with XDG_RUNTIME_DIR: %s", got)
	}
	t.Setenv("XDG_RUNTIME_DIR", "")
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_STATE_HOME", "")
	got := DefaultSocketPath()
	run := filepath.Join("/run/user", strconv.Itoa(os.Getuid()), "framepackd.sock")
	if got != run && got != filepath.Join(home, ".local/state/framepackd/framepackd.sock") {
		t.Fatalf("without XDG_RUNTIME_DIR: %s", got)
	}
	if _, err := os.Stat(filepath.Dir(run)); os.IsNotExist(err) && got == run {
		t.Fatalf("chose %s, which does not exist", run)
	}
	t.Setenv("XDG_STATE_HOME", "/var/lib/x")
	if got := DefaultStateHome(); got != "/var/lib/x/framepackd" {
		t.Fatalf("state home %s", got)
	}
}
