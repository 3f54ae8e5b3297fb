package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/tlstest"

	"github.com/framepackd/framepackd/supervisor/web"
)

// TestDaemonHTTP starts the daemon binary with --http on a loopback port and reads the page,
// the REST API and /metrics from it.
func TestDaemonHTTP(t *testing.T) {
	f := newFixture(t)
	f.withModels(t) // a serving daemon: its lane reads healthy
	cmd, logs, _ := f.start(t, "--http", "127.0.0.1:0")
	var addr string
	for _, line := range strings.Split(logs.String(), "\n") {
		var entry struct{ Msg, Addr, Scheme string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "serving http" {
			addr = entry.Addr
		}
	}
	if addr == "" {
		t.Fatalf("no \"serving http\" line in the logs:\n%s", logs.String())
	}
	for _, tc := range []struct{ path, want, csp string }{
		{"/", "<title>framepackd</title>", web.CSP},
		{"/v1/devices", `"lane":"cpu"`, ""},
		{"/v1/openapi.json", `"swagger": "2.0"`, ""},
		{"/metrics", "framepack_lane_state{lane=\"cpu\",state=\"healthy\"} 1", ""},
	} {
		resp, err := http.Get("http://" + addr + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), tc.want) || resp.Header.Get("Content-Security-Policy") != tc.csp {
			t.Errorf("GET %s: %d, CSP %q, body lacks %q:\n%.400s", tc.path, resp.StatusCode, resp.Header.Get("Content-Security-Policy"), tc.want, body)
		}
	}
	stop(t, cmd, logs)
}

// TestDaemonTLSToken serves gRPC on TCP with TLS and a token and reaches it with the CLI:
// with the CA and the token it lists the devices, without the token it is refused.
func TestDaemonTLSToken(t *testing.T) {
	f := newFixture(t)
	cli := testbin.Build(t, "./cmd/framepack")
	cert, key, _ := tlstest.SelfSigned(t, f.dir)
	tokenFile := filepath.Join(f.dir, "token")
	if err := os.WriteFile(tokenFile, []byte("tls-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd, logs, _ := f.start(t, "--listen", "tcp://127.0.0.1:0", "--tls-cert", cert, "--tls-key", key, "--token-file", tokenFile)
	var tcpAddr string
	for _, line := range strings.Split(logs.String(), "\n") {
		var entry struct{ Msg, Network, Addr string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" && entry.Network == "tcp" {
			tcpAddr = entry.Addr
		}
	}
	if tcpAddr == "" {
		t.Fatalf("no tcp listener in the logs:\n%s", logs.String())
	}
	run := func(env ...string) (int, string) {
		c := exec.CommandContext(t.Context(), cli, "devices", "--addr", "tcp://"+tcpAddr)
		c.Env = append(os.Environ(), env...)
		out, _ := c.CombinedOutput()
		return c.ProcessState.ExitCode(), string(out)
	}
	if code, out := run("FRAMEPACK_TLS_CA="+cert, "FRAMEPACK_TOKEN_FILE="+tokenFile); code != 0 || !strings.Contains(out, "cpu") {
		t.Errorf("with CA and token: exit %d\n%s", code, out)
	}
	if code, out := run("FRAMEPACK_TLS_CA=" + cert); code == 0 || !strings.Contains(strings.ToLower(out), "token") {
		t.Errorf("without token: exit %d\n%s", code, out)
	}
	if code, _ := run("FRAMEPACK_TOKEN_FILE=" + tokenFile); code == 0 {
		t.Errorf("plain text to the TLS listener succeeded")
	}
	stop(t, cmd, logs)
}
