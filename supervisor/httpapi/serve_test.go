package httpapi_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/framepackd/framepackd/internal/tlstest"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/httpapi"
)

func TestParseAddr(t *testing.T) {
	tests := []struct {
		in, want string
		loopback bool
		err      bool
	}{
		{in: "127.0.0.1:8188", want: "tcp://127.0.0.1:8188", loopback: true},
		{in: "tcp://[::1]:80", want: "tcp://[::1]:80", loopback: true},
		{in: "localhost:1", want: "tcp://localhost:1", loopback: true},
		{in: "0.0.0.0:8188", want: "tcp://0.0.0.0:8188"},
		{in: "192.168.1.5:8188", want: "tcp://192.168.1.5:8188"},
		{in: "unix:/run/f.sock", want: "unix:///run/f.sock", loopback: true},
		{in: "unix:///run/f.sock", want: "unix:///run/f.sock", loopback: true},
		{in: "8188", err: true},
		{in: "http://127.0.0.1:8188", err: true},
		{in: "127.0.0.1:99999", err: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			a, err := httpapi.ParseAddr(tc.in)
			if tc.err {
				if err == nil {
					t.Fatalf("got %v, want an error", a)
				}
				return
			}
			if err != nil || a.String() != tc.want || httpapi.Loopback(a) != tc.loopback {
				t.Fatalf("got %v (loopback %v) %v, want %s (loopback %v)", a, httpapi.Loopback(a), err, tc.want, tc.loopback)
			}
		})
	}
}

func writeToken(t *testing.T, tok string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSecurityFor(t *testing.T) {
	cert, key, _ := tlstest.SelfSigned(t, t.TempDir())
	tok := writeToken(t, "0123456789abcdef0123")
	short := writeToken(t, "short")
	spaced := writeToken(t, "0123456789abcdef 0123")
	wide, _ := httpapi.ParseAddr("0.0.0.0:8188")
	local, _ := httpapi.ParseAddr("127.0.0.1:8188")
	tests := []struct {
		name             string
		addr             api.Addr
		cert, key, token string
		tls              bool
		wantToken        bool
		err              string
	}{
		{name: "loopback plain", addr: local},
		{name: "loopback token", addr: local, token: tok, wantToken: true},
		{name: "loopback tls", addr: local, cert: cert, key: key, tls: true},
		{name: "beyond loopback, nothing", addr: wide, err: "needs TLS"},
		{name: "beyond loopback, no token", addr: wide, cert: cert, key: key, err: "bearer token"},
		{name: "beyond loopback, no tls", addr: wide, token: tok, err: "needs TLS"},
		{name: "beyond loopback, both", addr: wide, cert: cert, key: key, token: tok, tls: true, wantToken: true},
		{name: "cert without key", addr: local, cert: cert, err: "both a certificate and a key"},
		{name: "bad cert", addr: local, cert: tok, key: key, err: "load TLS certificate"},
		{name: "short token", addr: local, token: short, err: "at least 16"},
		{name: "token with a space", addr: local, token: spaced, err: "one word"},
		{name: "no token file", addr: local, token: "/nonexistent/token", err: "read token file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sec, err := httpapi.SecurityFor(tc.addr, tc.cert, tc.key, tc.token)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || (sec.TLS != nil) != tc.tls || (sec.Token != "") != tc.wantToken {
				t.Fatalf("got tls %v token %q err %v", sec.TLS != nil, sec.Token, err)
			}
		})
	}
}

// TestHTTPSWithToken serves the HTTP API over TLS with a token (no daemon behind it: the
// routes used need none) and checks who gets in.
func TestHTTPSWithToken(t *testing.T) {
	const token = "s3cret-token-0123456789"
	cert, key, pool := tlstest.SelfSigned(t, t.TempDir())
	addr, _ := httpapi.ParseAddr("127.0.0.1:0")
	sec, err := httpapi.SecurityFor(addr, cert, key, writeToken(t, token), "h2", "http/1.1")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("page")) })
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("metrics")) })
	h, err := httpapi.New(httpapi.Config{Conn: conn, JobDir: func(string) string { return t.TempDir() }, Page: page, Metrics: metrics,
		Token: sec.Token, SecureCookie: true})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := httpapi.Serve(addr, h, sec)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	base := "https://" + srv.Addr().String()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(path string, hdr ...string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", base+path, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			b.Write(buf[:n])
			if err != nil {
				break
			}
		}
		return resp, b.String()
	}
	tests := []struct {
		name, path string
		hdr        []string
		status     int
	}{
		{"page without token", "/", nil, 200},
		{"metrics without token", "/metrics", nil, 401},
		{"api without token", "/v1/openapi.json", nil, 401},
		{"wrong token", "/metrics", []string{"Authorization", "Bearer nope-nope-nope-nope"}, 401},
		{"basic auth", "/metrics", []string{"Authorization", "Basic " + token}, 401},
		{"metrics with token", "/metrics", []string{"Authorization", "Bearer " + token}, 200},
		{"openapi with token", "/v1/openapi.json", []string{"Authorization", "bearer " + token}, 200},
		{"cookie", "/metrics", []string{"Cookie", "framepackd_token=" + token}, 200},
		{"wrong cookie", "/metrics", []string{"Cookie", "framepackd_token=x"}, 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := get(tc.path, tc.hdr...)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 401 && (resp.Header.Get("WWW-Authenticate") == "" || !strings.Contains(body, "bearer token")) {
				t.Errorf("401 without a challenge or message: %v %s", resp.Header, body)
			}
		})
	}
	// The session call turns a good bearer token into an HttpOnly, Secure, SameSite cookie.
	req, _ := http.NewRequestWithContext(t.Context(), "POST", base+"/v1/session", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	c := resp.Cookies()
	if resp.StatusCode != http.StatusNoContent || len(c) != 1 || c[0].Value != token || !c[0].HttpOnly || !c[0].Secure || c[0].SameSite != http.SameSiteStrictMode {
		t.Fatalf("session: %d %v", resp.StatusCode, c)
	}
	req, _ = http.NewRequestWithContext(t.Context(), "POST", base+"/v1/session", nil)
	req.Header.Set("Authorization", "Bearer wrong-wrong-wrong-wrong")
	if resp, err = client.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 {
		t.Fatalf("session with a wrong token: %v %v", resp, err)
	}
	resp.Body.Close()
	// Plain HTTP to the TLS port gets nothing useful.
	if resp, err := http.Get("http://" + srv.Addr().String() + "/metrics"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("plain http served on the TLS listener")
		}
	}
}

// TestGRPCTokenAuth serves gRPC (health) on a TLS TCP listener and a unix socket with the
// token interceptors: TCP callers need the token, unix callers do not.
func TestGRPCTokenAuth(t *testing.T) {
	const token = "grpc-token-0123456789"
	cert, key, pool := tlstest.SelfSigned(t, t.TempDir())
	addr, _ := httpapi.ParseAddr("127.0.0.1:0")
	sec, err := httpapi.SecurityFor(addr, cert, key, writeToken(t, token), "h2")
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := api.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "g.sock")
	unix, err := api.Listen(api.Addr{Network: "unix", Address: sock})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(httpapi.GRPCTokenAuth(sec.Token)...)
	healthpb.RegisterHealthServer(g, health.NewServer())
	go g.Serve(tls.NewListener(tcp, sec.TLS))
	go g.Serve(unix)
	defer g.Stop()

	check := func(target string, creds credentials.TransportCredentials, md ...string) error {
		conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if len(md) > 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, md...)
		}
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	tlsCreds := credentials.NewTLS(&tls.Config{RootCAs: pool})
	tcpTarget := "passthrough:///" + tcp.Addr().String()
	if err := check(tcpTarget, tlsCreds, "authorization", "Bearer "+token); err != nil {
		t.Errorf("tcp with token: %v", err)
	}
	if err := check(tcpTarget, tlsCreds); status.Code(err) != codes.Unauthenticated {
		t.Errorf("tcp without token: %v", err)
	}
	if err := check(tcpTarget, tlsCreds, "authorization", "Bearer wrong"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("tcp with a wrong token: %v", err)
	}
	if err := check(tcpTarget, insecure.NewCredentials(), "authorization", "Bearer "+token); err == nil {
		t.Error("plain text accepted on the TLS listener")
	}
	if err := check(api.Addr{Network: "unix", Address: sock}.Target(), insecure.NewCredentials()); err != nil {
		t.Errorf("unix without token: %v", err)
	}
}
