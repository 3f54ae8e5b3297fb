package cluster

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// natsServer starts an embedded NATS server with JetStream on a loopback port and returns its
// URL; it stops when t ends.
func natsServer(t *testing.T) string {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s.ClientURL()
}

// join joins the cluster at url as node, with a state directory of its own.
func join(t *testing.T, url, node string, ackWait time.Duration) *Cluster {
	t.Helper()
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	if os.Getenv("FRAMEPACK_TEST_LOG") != "" {
		log.SetLevel(logrus.DebugLevel)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := Join(ctx, Config{URL: url, Node: node, StateDir: t.TempDir(), AckWait: ackWait, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
