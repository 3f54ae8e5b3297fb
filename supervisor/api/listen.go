package api

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
)

// Addr is a parsed listen or dial address (see internal/apiaddr, which the CLI shares).
type Addr = apiaddr.Addr

// ErrAddrInUse is returned by Listen when another server answers on the socket.
var ErrAddrInUse = errors.New("api: address in use by a running server")

// Listen listens on a. A unix socket's directory is created (0700) if missing, a stale socket
// file left by a dead daemon is replaced (a live one is refused with ErrAddrInUse), and the
// socket is made 0600: only this user may talk to the daemon.
func Listen(a apiaddr.Addr) (net.Listener, error) {
	if a.Network == "tcp" {
		l, err := net.Listen("tcp", a.Address)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w", a, err)
		}
		return l, nil
	}
	path := a.Address
	if len(path) > apiaddr.MaxSocketPath {
		return nil, fmt.Errorf("listen %s: socket path is %d bytes, the limit is %d", a, len(path), apiaddr.MaxSocketPath)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("listen %s: %w", a, err)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: %s exists and is not a socket", a, path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("listen %s: %w", a, ErrAddrInUse)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", a, err)
		}
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", a, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen %s: %w", a, err)
	}
	return l, nil
}
