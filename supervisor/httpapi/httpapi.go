// Package httpapi is framepackd's HTTP face beside gRPC: the framepack.v1 REST API (the
// grpc-gateway generated from the services' google.api.http rules, talking to the daemon's own
// gRPC server), its OpenAPI v2 document, a few endpoints gRPC transcoding cannot express
// (multipart image upload, Server-Sent Events and NDJSON watch streams, video downloads with
// range requests), /metrics, and the web page at /.
//
// Routes (every /v1 error is the gRPC status as JSON, {"code", "message", "details"}, with
// the HTTP status grpc-gateway maps the code to; GET /v1/openapi.json documents them all):
//
//	POST   /v1/jobs                          submit: JSON SubmitJobRequest (image base64), or
//	                                         multipart/form-data with an "image" file part, a
//	                                         "spec" part holding the JobSpec as JSON and an
//	                                         optional "end_image" file part
//	GET    /v1/jobs                          list (page_size, page_token, states)
//	GET    /v1/jobs:defaults                 the JobSpec defaults and the bucket tables the
//	                                         served models take
//	GET    /v1/jobs/{id}                     get
//	DELETE /v1/jobs/{id}                     delete a finished job and its files
//	POST   /v1/jobs/{id}:cancel              cancel ({"reason": "..."} optional)
//	GET    /v1/jobs/{id}:watch               watch: the same stream as /events
//	                                         (?include_previews=true)
//	GET    /v1/jobs/{id}/events              watch as Server-Sent Events (Accept:
//	                                         text/event-stream) or NDJSON (one JobEvent a line);
//	                                         ?previews=true adds Preview events
//	GET    /v1/jobs/{id}/video               the finished job's MP4 (range requests)
//	GET    /v1/jobs/{id}/sections/{n}/video  the MP4 written after section n (range requests)
//	GET    /v1/jobs/{id}/image               the start image as submitted
//	GET    /v1/jobs/{id}/end-image           the end image as submitted
//	GET    /v1/jobs/{id}/thumbnail           a small JPEG of the video so far
//	GET    /v1/devices                       devices and lanes, and why the server does not
//	                                         serve when it does not
//	POST   /v1/session                       bearer token to session cookie (the page)
//	GET    /v1/openapi.json                  the OpenAPI v2 document
//	GET    /metrics                          Prometheus metrics (when configured)
//	GET    /                                 the web page (when configured)
package httpapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
)

// DefaultMaxUploadBytes bounds a submitted image: the gRPC API's own limit.
const DefaultMaxUploadBytes = api.MaxImageBytes

// formOverhead is what a submit body may hold besides the image (the spec, multipart headers).
const formOverhead = 1 << 20

// Config holds the HTTP API's dependencies.
type Config struct {
	// Conn reaches the daemon's gRPC server (its unix socket); required.
	Conn grpc.ClientConnInterface
	// JobDir returns the directory of a job (jobs.Store.JobDir): videos are served only from
	// inside it; required.
	JobDir func(id string) string
	// Metrics serves /metrics; nil leaves it out.
	Metrics http.Handler
	// Page serves / and the page's assets; nil leaves it out.
	Page http.Handler
	// Token, when set, is the bearer token every /v1 and /metrics request must carry
	// (Authorization: Bearer <token>, or the cookie POST /v1/session sets).
	Token string
	// SecureCookie marks the session cookie Secure (set when serving TLS).
	SecureCookie bool
	// Version is the daemon's version, the OpenAPI document's info.version; empty: "devel".
	Version string
	// MaxUploadBytes bounds a submitted image; 0 means DefaultMaxUploadBytes.
	MaxUploadBytes int64
	// Log is the logger; nil discards.
	Log logrus.FieldLogger
}

// handler is the HTTP API.
type handler struct {
	cfg     Config
	log     logrus.FieldLogger
	jobs    framepackv1.JobServiceClient
	gw      *runtime.ServeMux
	marshal runtime.Marshaler
	openapi []byte // the OpenAPI document (openapi.go)
}

// sessionCookie carries the token for requests a page cannot add a header to (<video src>).
const sessionCookie = "framepackd_token"

// New returns the HTTP API's handler.
func New(cfg Config) (http.Handler, error) {
	if cfg.Conn == nil || cfg.JobDir == nil {
		return nil, errors.New("new http api: Conn and JobDir are required")
	}
	if cfg.MaxUploadBytes <= 0 {
		cfg.MaxUploadBytes = DefaultMaxUploadBytes
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = l
	}
	m := &runtime.JSONPb{MarshalOptions: protojson.MarshalOptions{}, UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false}}
	h := &handler{cfg: cfg, log: log, jobs: framepackv1.NewJobServiceClient(cfg.Conn), marshal: m}
	h.gw = runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, m),
		runtime.WithErrorHandler(h.gatewayError),
	)
	ctx := context.Background()
	var err error
	if err = framepackv1.RegisterJobServiceHandlerClient(ctx, h.gw, h.jobs); err != nil {
		return nil, fmt.Errorf("new http api: %w", err)
	}
	if err := framepackv1.RegisterDeviceServiceHandlerClient(ctx, h.gw, framepackv1.NewDeviceServiceClient(cfg.Conn)); err != nil {
		return nil, fmt.Errorf("new http api: %w", err)
	}
	if err := framepackv1.RegisterPresetServiceHandlerClient(ctx, h.gw, framepackv1.NewPresetServiceClient(cfg.Conn)); err != nil {
		return nil, fmt.Errorf("new http api: %w", err)
	}
	if err := framepackv1.RegisterBatchServiceHandlerClient(ctx, h.gw, framepackv1.NewBatchServiceClient(cfg.Conn)); err != nil {
		return nil, fmt.Errorf("new http api: %w", err)
	}

	routes := h.routes()
	if h.openapi, err = buildOpenAPI(cfg.Version, routes); err != nil {
		return nil, fmt.Errorf("new http api: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/", h.serveGateway)
	for _, rt := range routes {
		mux.HandleFunc(rt.pattern, rt.handler)
	}
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.Page != nil {
		mux.Handle("/", cfg.Page)
	} else {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			h.writeError(w, r, status.Errorf(codes.NotFound, "no route %s %s", r.Method, r.URL.Path))
		})
	}
	return h.wrap(mux), nil
}

// wrap adds what every request gets: panic recovery, the token check, a body limit, security
// headers and a log line.
func (h *handler) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				h.log.WithFields(logrus.Fields{"method": r.Method, "path": r.URL.Path, "panic": fmt.Sprint(p)}).Error("http handler panicked")
				if sw.status == 0 {
					h.writeError(sw, r, status.Errorf(codes.Internal, "internal error in %s %s (logged by the server)", r.Method, r.URL.Path))
				}
			}
			h.log.WithFields(logrus.Fields{"method": r.Method, "path": r.URL.Path, "status": sw.status, "duration": time.Since(start)}).Debug("http")
		}()
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		if h.needsToken(r) && !h.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="framepackd"`)
			h.writeError(sw, r, status.Error(codes.Unauthenticated, "missing or wrong bearer token (Authorization: Bearer <token from the daemon's --http-token-file>)"))
			return
		}
		if r.Body != nil && r.Method != http.MethodGet && r.Method != http.MethodHead {
			limit := h.bodyLimit()
			if r.ContentLength > limit {
				h.writeErrorStatus(sw, r, http.StatusRequestEntityTooLarge, status.Errorf(codes.InvalidArgument, "request body is %d bytes, the limit is %d", r.ContentLength, limit))
				return
			}
			r.Body = http.MaxBytesReader(sw, r.Body, limit)
		}
		next.ServeHTTP(sw, r)
	})
}

// bodyLimit is the largest request body: a request may carry several images (start, end,
// keyframes) and a video, so eight base64 images of MaxUploadBytes, at most the gRPC API's
// MaxRequestBytes in base64, and the rest.
func (h *handler) bodyLimit() int64 {
	return min(8*((h.cfg.MaxUploadBytes+2)/3*4), (api.MaxRequestBytes+2)/3*4) + formOverhead
}

// needsToken reports whether r must carry the token: the API and metrics do, the page's
// static files (no data in them) and the session call (it checks the token itself) do not.
func (h *handler) needsToken(r *http.Request) bool {
	if h.cfg.Token == "" {
		return false
	}
	p := r.URL.Path
	if p == "/v1/session" {
		return false
	}
	return strings.HasPrefix(p, "/v1/") || p == "/metrics"
}

// authorized reports whether r carries the token, in its Authorization header or cookie.
func (h *handler) authorized(r *http.Request) bool {
	if tok, ok := bearer(r); ok {
		return subtle.ConstantTimeCompare([]byte(tok), []byte(h.cfg.Token)) == 1
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return subtle.ConstantTimeCompare([]byte(c.Value), []byte(h.cfg.Token)) == 1
	}
	return false
}

func bearer(r *http.Request) (string, bool) {
	a := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(a, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// session checks the bearer token and sets it as an HttpOnly, SameSite=Strict cookie, so the
// page's <video> and EventSource requests carry it. Without a token configured it says so.
func (h *handler) session(w http.ResponseWriter, r *http.Request) {
	if h.cfg.Token == "" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if !h.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="framepackd"`)
		h.writeError(w, r, status.Error(codes.Unauthenticated, "missing or wrong bearer token"))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: h.cfg.Token, Path: "/", HttpOnly: true,
		Secure: h.cfg.SecureCookie, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

// statusWriter records the status code written.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

// Flush passes flushes through (streams).
func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// gatewayError is the gateway's error handler: grpc-gateway's default, except that a body over
// the limit is 413.
func (h *handler) gatewayError(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || strings.Contains(err.Error(), "http: request body too large") {
		h.writeTooLarge(w, r, "")
		return
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// writeTooLarge answers a body over the limit: 413 with the limit, and hint in brackets.
func (h *handler) writeTooLarge(w http.ResponseWriter, r *http.Request, hint string) {
	msg := fmt.Sprintf("request body too large: the limit is %d bytes", h.bodyLimit())
	if hint != "" {
		msg += " (" + hint + ")"
	}
	h.writeErrorStatus(w, r, http.StatusRequestEntityTooLarge, status.Error(codes.InvalidArgument, msg))
}

// writeError writes err (a gRPC status, or an error turned into one) as the gateway does.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	st, _ := status.FromError(err)
	h.writeErrorStatus(w, r, runtime.HTTPStatusFromCode(st.Code()), err)
}

// writeErrorStatus writes err's status as JSON with the given HTTP status.
func (h *handler) writeErrorStatus(w http.ResponseWriter, _ *http.Request, code int, err error) {
	st, _ := status.FromError(err)
	body, merr := h.marshal.Marshal(st.Proto())
	if merr != nil {
		body = []byte(`{"code":13,"message":"failed to marshal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
