package httpapi

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// sseKeepAlive is how often an idle event stream gets a comment line, so proxies and
// browsers keep it open.
const sseKeepAlive = 15 * time.Second

// events streams a job's events (WatchJob) as Server-Sent Events when the client accepts
// text/event-stream (EventSource does), else as NDJSON, one JobEvent (protojson) a line.
// The first event is the job's snapshot; the stream ends after the terminal event. An error
// before the first event (unknown job) is an HTTP error; a later one is a final "error" event
// (SSE) or {"error": status} line (NDJSON).
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("jobId")
	previews := false
	// previews here; :watch documents WatchJobRequest's include_previews (either spelling).
	for _, name := range []string{"previews", "include_previews", "includePreviews"} {
		v := r.URL.Query().Get(name)
		if v == "" {
			continue
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			h.writeError(w, r, status.Errorf(codes.InvalidArgument, "%s: %q is not true or false", name, v))
			return
		}
		previews = b
	}
	stream, err := h.jobs.WatchJob(r.Context(), &framepackv1.WatchJobRequest{JobId: id, IncludePreviews: previews})
	first, ok := openStream(h, w, r, stream, err)
	if !ok {
		return
	}
	sse := strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	if sse {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/x-ndjson")
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	mo := protojson.MarshalOptions{}

	// Recv blocks; a goroutine feeds the events so the keep-alive can tick meanwhile.
	type item struct {
		ev  *framepackv1.JobEvent
		err error
	}
	ch := make(chan item, 16)
	go func() {
		defer close(ch)
		for {
			ev, err := stream.Recv()
			select {
			case ch <- item{ev, err}:
			case <-r.Context().Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	write := func(ev *framepackv1.JobEvent) error {
		raw, err := mo.Marshal(ev)
		if err != nil {
			return err
		}
		if sse {
			_, err = io.WriteString(w, "event: "+eventKind(ev)+"\ndata: "+string(raw)+"\n\n")
		} else {
			_, err = w.Write(append(raw, '\n'))
		}
		if err == nil {
			err = rc.Flush()
		}
		return err
	}
	if err := write(first); err != nil {
		return
	}
	tick := time.NewTicker(sseKeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			if sse {
				if _, err := io.WriteString(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
					return
				}
			}
		case it, ok := <-ch:
			if !ok {
				return
			}
			if errors.Is(it.err, io.EOF) {
				return
			}
			if it.err != nil {
				st, _ := status.FromError(it.err)
				raw, _ := mo.Marshal(st.Proto())
				if sse {
					_, _ = io.WriteString(w, "event: error\ndata: "+string(raw)+"\n\n")
				} else {
					_, _ = io.WriteString(w, `{"error":`+string(raw)+"}\n")
				}
				_ = rc.Flush()
				return
			}
			if err := write(it.ev); err != nil {
				return
			}
		}
	}
}

// serveGateway serves /v1 through grpc-gateway, except WatchJob's GET /v1/jobs/{id}:watch:
// the gateway would wrap each event in {"result": ...}; events serves it as it serves
// /events, so both streams are framed alike.
func (h *handler) serveGateway(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet {
		if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/jobs/"); ok {
			if id, ok := strings.CutSuffix(rest, ":watch"); ok && id != "" && !strings.Contains(id, "/") {
				r.SetPathValue("jobId", id)
				h.events(w, r)
				return
			}
		}
	}
	h.gw.ServeHTTP(w, r)
}

// eventKind names an event's payload as its JSON field does ("samplingStep", "preview", ...),
// the SSE event type the page listens for.
func eventKind(ev *framepackv1.JobEvent) string {
	od := ev.ProtoReflect().Descriptor().Oneofs().ByName("event")
	if fd := ev.ProtoReflect().WhichOneof(od); fd != nil {
		return fd.JSONName()
	}
	return "message"
}

// writeProto writes m as JSON with the gateway's marshaler.
func (h *handler) writeProto(w http.ResponseWriter, code int, m proto.Message) {
	raw, err := h.marshal.Marshal(m)
	if err != nil {
		h.writeError(w, nil, status.Errorf(codes.Internal, "marshal response: %v", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(raw)
}
