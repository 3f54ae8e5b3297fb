package httpapi

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
	"github.com/framepackd/framepackd/supervisor/api"
)

// ParseAddr reads the --http address: "HOST:PORT" or "tcp://HOST:PORT" for TCP,
// "unix:/path" or "unix:///path" for a unix socket.
func ParseAddr(s string) (api.Addr, error) {
	switch {
	case strings.HasPrefix(s, "unix:"), strings.HasPrefix(s, "tcp://"):
		return apiaddr.ParseAddr(s)
	case strings.Contains(s, "://"):
		return api.Addr{}, fmt.Errorf("parse address %q: want HOST:PORT, tcp://HOST:PORT or unix:/path", s)
	}
	if _, _, err := net.SplitHostPort(s); err != nil {
		return api.Addr{}, fmt.Errorf("parse address %q: want HOST:PORT, tcp://HOST:PORT or unix:/path: %w", s, err)
	}
	return apiaddr.ParseAddr("tcp://" + s)
}

// Loopback reports whether a only reaches this machine: a unix socket, or TCP on a loopback
// address or localhost.
func Loopback(a api.Addr) bool {
	if a.Network == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(a.Address)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Security is how a listener is protected.
type Security struct {
	// TLS is the server's TLS configuration; nil serves plain text.
	TLS *tls.Config
	// Token is the bearer token clients must send; empty requires none.
	Token string
}

// SecurityFor loads the TLS certificate and the token file for a listener on a, and enforces
// the rule: beyond loopback both are required. On loopback each is used when given. nextProtos
// are the ALPN protocols to offer ("h2" for gRPC).
func SecurityFor(a api.Addr, certFile, keyFile, tokenFile string, nextProtos ...string) (Security, error) {
	var sec Security
	if (certFile == "") != (keyFile == "") {
		return sec, errors.New("give both a certificate and a key file, or neither")
	}
	if !Loopback(a) && (certFile == "" || tokenFile == "") {
		return sec, fmt.Errorf("%s is reachable beyond this machine: it needs TLS (a certificate and key file) and a bearer token file", a)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return sec, fmt.Errorf("load TLS certificate: %w", err)
		}
		sec.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12, NextProtos: nextProtos}
	}
	if tokenFile != "" {
		tok, err := ReadToken(tokenFile)
		if err != nil {
			return sec, err
		}
		sec.Token = tok
	}
	return sec, nil
}

// minTokenBytes is the shortest bearer token accepted.
const minTokenBytes = 16

// ReadToken reads a bearer token file: its content, surrounding white space removed, at least
// 16 bytes, no inner white space.
func ReadToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token file: %w", err)
	}
	tok := strings.TrimSpace(string(raw))
	switch {
	case len(tok) < minTokenBytes:
		return "", fmt.Errorf("token file %s: the token is %d bytes, at least %d are needed (e.g. openssl rand -hex 32 > %s)", path, len(tok), minTokenBytes, path)
	case strings.ContainsAny(tok, " \t\r\n"):
		return "", fmt.Errorf("token file %s: the token must be one word", path)
	}
	return tok, nil
}

// Server is a running HTTP listener.
type Server struct {
	srv    *http.Server
	l      net.Listener
	cancel context.CancelFunc
	done   chan error
}

// Serve serves h on a (a unix socket made 0600, or TCP), with TLS when sec.TLS is set.
// Errors of the running server arrive on Err.
func Serve(a api.Addr, h http.Handler, sec Security) (*Server, error) {
	l, err := api.Listen(a)
	if err != nil {
		return nil, err
	}
	if sec.TLS != nil {
		l = tls.NewListener(l, sec.TLS)
	}
	base, cancel := context.WithCancel(context.Background())
	s := &Server{l: l, cancel: cancel, done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: 64 << 10, BaseContext: func(net.Listener) context.Context { return base }}}
	go func() {
		err := s.srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
		close(s.done)
	}()
	return s, nil
}

// Addr is the address served (a TCP port 0 resolved).
func (s *Server) Addr() net.Addr { return s.l.Addr() }

// Err receives the error a failing listener stops with.
func (s *Server) Err() <-chan error { return s.done }

// Close ends every request (watch streams included) and stops the server; ctx bounds the wait.
func (s *Server) Close(ctx context.Context) error {
	s.cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	return err
}
