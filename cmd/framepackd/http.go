package main

// The HTTP listener's part of the daemon: flags, and the REST gateway, /metrics and the web
// page (supervisor/httpapi, supervisor/metrics, supervisor/web) on --http.

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/framepackd/framepackd/internal/buildinfo"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/httpapi"
	"github.com/framepackd/framepackd/supervisor/metrics"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// httpOptions are the HTTP listener's flags and the TLS and token flags of both TCP listeners.
type httpOptions struct {
	addr      *api.Addr // nil: --http not given
	certFile  string
	keyFile   string
	tokenFile string
	noPage    bool
}

// addHTTPFlags registers the HTTP listener's flags and the TCP listeners' security flags on fs.
func addHTTPFlags(fs *flag.FlagSet) *httpOptions {
	h := &httpOptions{}
	fs.Func("http", "also serve the REST API, /metrics and the web page on HOST:PORT (e.g. 127.0.0.1:8188) or unix:/path; off by default. Beyond loopback it needs --tls-cert, --tls-key and --token-file", func(v string) error {
		a, err := httpapi.ParseAddr(v)
		if err != nil {
			return err
		}
		h.addr = &a
		return nil
	})
	fs.StringVar(&h.certFile, "tls-cert", "", "TLS certificate (PEM) of the TCP listeners (--http, --listen); required beyond loopback")
	fs.StringVar(&h.keyFile, "tls-key", "", "TLS private key (PEM) for --tls-cert")
	fs.StringVar(&h.tokenFile, "token-file", "", "file holding the bearer token the TCP listeners (--http, --listen) require (at least 16 bytes); required beyond loopback")
	fs.BoolVar(&h.noPage, "http-no-page", false, "serve the API and /metrics on --http, not the web page")
	return h
}

// listenGRPC opens the gRPC TCP listener of --listen: TLS when --tls-cert is given, the
// bearer token check when --token-file is, both required beyond loopback.
func listenGRPC(a api.Addr, h *httpOptions) ([]net.Listener, []grpc.ServerOption, error) {
	sec, err := httpapi.SecurityFor(a, h.certFile, h.keyFile, h.tokenFile, "h2")
	if err != nil {
		return nil, nil, fmt.Errorf("--listen: %w", err)
	}
	l, err := api.Listen(a)
	if err != nil {
		return nil, nil, err
	}
	if sec.TLS != nil {
		l = tls.NewListener(l, sec.TLS)
	}
	var opts []grpc.ServerOption
	if sec.Token != "" {
		opts = httpapi.GRPCTokenAuth(sec.Token)
	}
	return []net.Listener{l}, opts, nil
}

// httpParts are what the HTTP listener serves besides the API.
type httpParts struct {
	metrics http.Handler
	page    http.Handler
}

// startHTTP serves the HTTP API on o.http.addr, the gateway talking to the daemon's own unix
// socket. It returns a stop function and a channel of serving errors; both are no-ops when
// --http is empty.
func startHTTP(o *options, d *api.Daemon, parts httpParts, log *logrus.Logger) (stop func(), errs <-chan error, err error) {
	h := o.http
	if h.addr == nil {
		return func() {}, nil, nil
	}
	addr := *h.addr
	sec, err := httpapi.SecurityFor(addr, h.certFile, h.keyFile, h.tokenFile, "h2", "http/1.1")
	if err != nil {
		return nil, nil, fmt.Errorf("--http: %w", err)
	}
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: o.socket}.Target(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(api.MaxRecvMsgBytes), grpc.MaxCallRecvMsgSize(api.MaxRecvMsgBytes)))
	if err != nil {
		return nil, nil, fmt.Errorf("http gateway: dial %s: %w", o.socket, err)
	}
	page := parts.page
	if h.noPage {
		page = nil
	}
	handler, err := httpapi.New(httpapi.Config{Conn: conn, JobDir: func(id string) string { return d.Jobs().JobDir(id).Path() },
		Metrics: parts.metrics, Page: page, Token: sec.Token, SecureCookie: sec.TLS != nil, Version: buildinfo.Short(), Log: log})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	srv, err := httpapi.Serve(addr, handler, sec)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	scheme := "http"
	if sec.TLS != nil {
		scheme = "https"
	}
	log.WithFields(logrus.Fields{"addr": srv.Addr().String(), "scheme": scheme, "token": sec.Token != ""}).Info("serving http")
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Close(ctx); err != nil {
				log.WithError(err).Warn("stop http listener")
			}
			conn.Close()
		})
	}, srv.Err(), nil
}

// daemonMetrics are the daemon's metrics with what they read at scrape time: the daemon's job
// store and running jobs once attach has been called, and the devices.
type daemonMetrics struct {
	*metrics.Metrics
	d atomic.Pointer[api.Daemon]
}

// newMetrics returns the metrics; devices lists the devices as the API does.
func newMetrics(devices func(context.Context) ([]*framepackv1.Device, error), log *logrus.Logger) *daemonMetrics {
	dm := &daemonMetrics{}
	dm.Metrics = metrics.New(metrics.Config{Log: log,
		Jobs: func() (map[framepackv1.JobState]int, error) {
			d := dm.d.Load()
			if d == nil {
				return map[framepackv1.JobState]int{}, nil
			}
			return metrics.CountJobs(d.Jobs())
		},
		// As ListDevices answers (with the jobs running and whether the daemon serves) once
		// the daemon is attached; before, the devices alone.
		Devices: func(ctx context.Context) (*framepackv1.ListDevicesResponse, error) {
			if d := dm.d.Load(); d != nil {
				return d.ListDevices(ctx)
			}
			devs, err := devices(ctx)
			if err != nil {
				return nil, err
			}
			return &framepackv1.ListDevicesResponse{Devices: devs}, nil
		}})
	return dm
}

// attach lets the metrics read d's store and queue.
func (m *daemonMetrics) attach(d *api.Daemon) { m.d.Store(d) }

// stage is the pipeline's OnStage hook: worker spawns and exits, convolution tiers.
func (m *daemonMetrics) stage(rec pipeline.StageRecord) {
	r := metrics.StageRecord{Lane: rec.Lane, Worker: rec.Worker, Reused: rec.Reused, Kept: rec.Kept, Err: rec.Err}
	for _, t := range rec.ConvTiers {
		r.ConvTiers = append(r.ConvTiers, metrics.ConvTier{Tier: metrics.TierName(framepackv1.ConvTier(t.Tier)),
			Attempts: t.Attempts, Successes: t.Successes, Failures: t.Failures, SkippedAsHung: t.SkippedAsHung, Time: t.Time})
	}
	m.ObserveStage(r)
}
