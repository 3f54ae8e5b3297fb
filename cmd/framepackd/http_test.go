package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/supervisor/web"
)

// TestDaemonHTTP starts the daemon binary with --http on a loopback port and reads the page,
// the REST API and /metrics from it.
func TestDaemonHTTP(t *testing.T) {
	f := newFixture(t)
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
