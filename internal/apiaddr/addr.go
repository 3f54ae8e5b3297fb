// Package apiaddr is the daemon's address vocabulary that the server and the CLI share: the
// default socket and state paths, and the unix/tcp addresses flags name. It holds no server
// code, so the CLI links it without the daemon.
package apiaddr

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// SocketName is the file name of the daemon's unix socket.
const SocketName = "framepackd.sock"

// MaxSocketPath is the longest path a unix socket address can hold (sun_path, 108 bytes with
// its terminating NUL).
const MaxSocketPath = 107

// DefaultSocketPath is where the daemon listens and the CLI connects when neither is told
// otherwise, the first of:
//
//  1. $XDG_RUNTIME_DIR/framepackd.sock, when XDG_RUNTIME_DIR is set (systemd user sessions set
//     it to /run/user/<uid>, a private tmpfs removed at logout — the place for sockets);
//  2. /run/user/<uid>/framepackd.sock, when that directory exists and belongs to this user
//     (a session without the variable, e.g. sudo -u or cron);
//  3. $XDG_STATE_HOME/framepackd/framepackd.sock, else ~/.local/state/framepackd/framepackd.sock
//     (no runtime directory at all: containers, services without a login session).
func DefaultSocketPath() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(d) {
		return filepath.Join(d, SocketName)
	}
	run := filepath.Join("/run/user", strconv.Itoa(os.Getuid()))
	if st, err := os.Stat(run); err == nil && st.IsDir() {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) == os.Getuid() {
			return filepath.Join(run, SocketName)
		}
	}
	return filepath.Join(DefaultStateHome(), SocketName)
}

// DefaultStateHome is $XDG_STATE_HOME/framepackd, else ~/.local/state/framepackd: the default
// state directory of the daemon.
func DefaultStateHome() string {
	if d := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "framepackd")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		home = os.TempDir()
	}
	return filepath.Join(home, ".local", "state", "framepackd")
}

// Addr is a parsed listen or dial address.
type Addr struct {
	// Network is "unix" or "tcp".
	Network string
	// Address is the socket path or host:port.
	Address string
}

// String returns the address in the form ParseAddr reads.
func (a Addr) String() string { return a.Network + "://" + a.Address }

// ParseAddr reads an address: "unix:///path/to.sock", "unix:relative.sock", a bare path
// (containing a '/' or ending in ".sock"), or "tcp://host:port".
func ParseAddr(s string) (Addr, error) {
	switch {
	case strings.HasPrefix(s, "unix://"):
		s = strings.TrimPrefix(s, "unix://")
	case strings.HasPrefix(s, "unix:"):
		s = strings.TrimPrefix(s, "unix:")
	case strings.HasPrefix(s, "tcp://"):
		hp := strings.TrimPrefix(s, "tcp://")
		host, port, err := net.SplitHostPort(hp)
		if err != nil {
			return Addr{}, fmt.Errorf("parse address %q: %w", s, err)
		}
		if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
			return Addr{}, fmt.Errorf("parse address %q: bad port %q", s, port)
		}
		return Addr{Network: "tcp", Address: net.JoinHostPort(host, port)}, nil
	case strings.Contains(s, "://"):
		return Addr{}, fmt.Errorf("parse address %q: scheme must be unix:// or tcp://", s)
	case !strings.Contains(s, "/") && !strings.HasSuffix(s, ".sock"):
		return Addr{}, fmt.Errorf("parse address %q: want unix:///path, a socket path, or tcp://host:port", s)
	}
	if s == "" {
		return Addr{}, fmt.Errorf("parse address: empty socket path")
	}
	return Addr{Network: "unix", Address: filepath.Clean(s)}, nil
}

// Target returns the gRPC dial target for a.
func (a Addr) Target() string {
	if a.Network == "unix" {
		abs, err := filepath.Abs(a.Address)
		if err != nil {
			abs = a.Address
		}
		return "unix://" + abs
	}
	return "passthrough:///" + a.Address
}
