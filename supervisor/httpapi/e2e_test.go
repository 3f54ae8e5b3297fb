package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"image/jpeg"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/httpapi/httpapitest"
)

func TestMain(m *testing.M) { os.Exit(workertest.Main(m)) }

// multipartBody is a multipart submit: the image part and the spec part, and an end_image
// part when end is given.
func multipartBody(t *testing.T, image []byte, filename string, spec *framepackv1.JobSpec, end ...[]byte) (io.Reader, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, err := mw.CreateFormFile("image", filename)
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(image)
	for _, e := range end {
		fw, err := mw.CreateFormFile("end_image", "end.png")
		if err != nil {
			t.Fatal(err)
		}
		fw.Write(e)
	}
	raw, err := protojson.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := mw.WriteField("spec", string(raw)); err != nil {
		t.Fatal(err)
	}
	mw.Close()
	return &b, mw.FormDataContentType()
}

// do sends a request and returns the status and body.
func do(t *testing.T, method, url, contentType string, body io.Reader, hdr ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, raw
}

// apiError is the JSON of an error response.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func errorOf(t *testing.T, raw []byte) apiError {
	t.Helper()
	var e apiError
	if err := json.Unmarshal(raw, &e); err != nil {
		t.Fatalf("error body %q: %v", raw, err)
	}
	return e
}

func jobOf(t *testing.T, raw []byte) *framepackv1.Job {
	t.Helper()
	var r framepackv1.SubmitJobResponse // {"job": ...}, as GetJob and CancelJob answer too
	if err := protojson.Unmarshal(raw, &r); err != nil {
		t.Fatalf("job response %q: %v", raw, err)
	}
	return r.GetJob()
}

// TestRESTEndToEnd drives a real daemon (real workers, tiny models) through the REST API only:
// a multipart submit (with an end frame part), the NDJSON event stream to the end, the finished MP4 (ffprobe) with a
// range request, a section video, the SSE and :watch streams of the finished job (:watch framed
// as /events), the VAE decode's progress events, the start and end images and the thumbnail,
// list and get, a cancelled second job, bad requests that get a 4xx with the gRPC API's
// message, every route of the OpenAPI document, and /metrics parsed after it all.
func TestRESTEndToEnd(t *testing.T) {
	d := httpapitest.Start(t, httpapitest.Options{})
	imgPath, err := httpapitest.DemoImage()
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(imgPath)
	if err != nil {
		t.Fatal(err)
	}
	const steps = 3
	spec := httpapitest.TinySpec(1, steps)

	// Submit (multipart, with the image as its own end frame in an "end_image" part) and a
	// second job, JSON with the image in base64, queued behind it.
	body, ct := multipartBody(t, image, "start.png", spec, image)
	code, _, raw := do(t, "POST", d.URL+"/v1/jobs", ct, body)
	if code != http.StatusOK {
		t.Fatalf("multipart submit: %d %s", code, raw)
	}
	job := jobOf(t, raw)
	if job.GetState() != framepackv1.JobState_JOB_STATE_QUEUED || job.GetSpec().GetImageFilename() != "start.png" {
		t.Fatalf("submitted job: %v", job)
	}
	// The second job has an end frame, in base64 like the image: the stored spec keeps only
	// its hash.
	req := &framepackv1.SubmitJobRequest{Image: image, Spec: httpapitest.TinySpec(1, steps)}
	req.Spec.EndImage, req.Spec.EndStrength = image, proto.Float32(0.5)
	jraw, _ := protojson.Marshal(req)
	if !bytes.Contains(jraw, []byte(base64.StdEncoding.EncodeToString(image[:30]))) {
		t.Fatal("protojson does not carry the image as base64")
	}
	code, _, raw = do(t, "POST", d.URL+"/v1/jobs", "application/json", bytes.NewReader(jraw))
	if code != http.StatusOK {
		t.Fatalf("json submit: %d %s", code, raw)
	}
	second := jobOf(t, raw)
	sum := sha256.Sum256(image)
	if sp := second.GetSpec(); len(sp.GetEndImage()) != 0 || sp.GetEndImageSha256() != hex.EncodeToString(sum[:]) || sp.GetEndStrength() != 0.5 {
		t.Fatalf("json submit with an end frame: stored spec has %d end image bytes, sha256 %q, strength %g", len(sp.GetEndImage()), sp.GetEndImageSha256(), sp.GetEndStrength())
	}
	if sp := job.GetSpec(); len(sp.GetEndImage()) != 0 || sp.GetEndImageSha256() != hex.EncodeToString(sum[:]) || sp.GetEndStrength() != 1 {
		t.Fatalf("multipart submit with an end_image part: stored spec %v", sp)
	}

	// Cancel the second job while it waits.
	code, _, raw = do(t, "POST", d.URL+"/v1/jobs/"+second.GetId()+":cancel", "application/json", strings.NewReader(`{"reason":"test"}`))
	if code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, raw)
	}
	if st := jobOf(t, raw).GetState(); st != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("cancelled job is %v", st)
	}

	// Watch the first as NDJSON to its end.
	var kinds []string
	var sections []uint32
	var stepsSeen, previews int
	var decodes []*framepackv1.StageProgress
	var final *framepackv1.JobEvent
	func() {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
		defer cancel()
		hreq, _ := http.NewRequestWithContext(ctx, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/events?previews=true", nil)
		resp, err := http.DefaultClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
			t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			ev := &framepackv1.JobEvent{}
			if err := protojson.Unmarshal(sc.Bytes(), ev); err != nil {
				t.Fatalf("event line %q: %v", sc.Bytes(), err)
			}
			switch e := ev.GetEvent().(type) {
			case *framepackv1.JobEvent_SamplingStep:
				stepsSeen++
			case *framepackv1.JobEvent_Preview:
				if !bytes.HasPrefix(e.Preview.GetPng(), []byte("\x89PNG")) {
					t.Errorf("preview is not a PNG")
				}
				previews++
			case *framepackv1.JobEvent_SectionVideo:
				sections = append(sections, e.SectionVideo.GetSectionIndex())
			case *framepackv1.JobEvent_StageProgress:
				decodes = append(decodes, e.StageProgress)
			}
			if len(kinds) == 0 || kinds[len(kinds)-1] != fmt.Sprintf("%T", ev.GetEvent()) {
				kinds = append(kinds, fmt.Sprintf("%T", ev.GetEvent()))
			}
			final = ev
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("read events: %v", err)
		}
	}()
	if final.GetJobFinished() == nil {
		t.Fatalf("event stream ended with %v (kinds %v)", final, kinds)
	}
	if !strings.Contains(kinds[0], "Snapshot") {
		t.Errorf("first event is %s, want the snapshot", kinds[0])
	}
	if len(sections) != 2 || stepsSeen == 0 {
		t.Errorf("sections %v, %d sampling steps", sections, stepsSeen)
	}
	t.Logf("events: %d sampling steps, %d previews, sections %v, %d decode progress events", stepsSeen, previews, sections, len(decodes))
	checkDecodeProgress(t, decodes, len(sections))
	frames := final.GetJobFinished().GetResult().GetFrameCount()

	// The finished MP4: ffprobe reads it, its duration matches the frame count at 30 fps.
	code, hdr, mp4 := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/video", "", nil)
	if code != http.StatusOK || hdr.Get("Content-Type") != "video/mp4" || hdr.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("video: %d %v", code, hdr)
	}
	probe := ffprobe(t, mp4)
	if want := float64(frames) / 30; math.Abs(probe.duration-want) > 0.1 || probe.codec != "h264" {
		t.Errorf("ffprobe: %+v, want h264 of %.3f s (%d frames)", probe, want, frames)
	}
	// A range request gets those bytes and 206.
	code, hdr, part := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/video", "", nil, "Range", "bytes=100-199")
	if code != http.StatusPartialContent || !bytes.Equal(part, mp4[100:200]) || hdr.Get("Content-Range") != fmt.Sprintf("bytes 100-199/%d", len(mp4)) {
		t.Errorf("range: %d %q, %d bytes", code, hdr.Get("Content-Range"), len(part))
	}
	code, hdr, _ = do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/video?download=true", "", nil, "Range", fmt.Sprintf("bytes=%d-", len(mp4)+10))
	if code != http.StatusRequestedRangeNotSatisfiable {
		t.Errorf("range past the end: %d", code)
	}
	// The first section's video is the video so far.
	code, _, sec0 := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/sections/0/video", "", nil)
	if code != http.StatusOK {
		t.Fatalf("section video: %d %s", code, sec0)
	}
	if p := ffprobe(t, sec0); p.duration <= 0 || p.duration >= probe.duration {
		t.Errorf("section 0 video lasts %.3f s, the whole %.3f s", p.duration, probe.duration)
	}

	// The finished job's SSE stream: snapshot first, jobFinished last.
	code, hdr, sse := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/events", "", nil, "Accept", "text/event-stream")
	if code != http.StatusOK || hdr.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("sse: %d %v", code, hdr)
	}
	var sseKinds []string
	for _, line := range strings.Split(string(sse), "\n") {
		if k, ok := strings.CutPrefix(line, "event: "); ok {
			sseKinds = append(sseKinds, k)
		}
	}
	if len(sseKinds) < 3 || sseKinds[0] != "snapshot" || sseKinds[len(sseKinds)-1] != "jobFinished" {
		t.Errorf("sse event kinds %v", sseKinds)
	}
	// WatchJob's own route is framed as /events is: one JobEvent a line, the same events.
	code, hdr, gw := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+":watch", "", nil)
	_, _, nd := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/events", "", nil)
	if code != http.StatusOK || hdr.Get("Content-Type") != "application/x-ndjson" {
		t.Errorf(":watch: %d %q", code, hdr.Get("Content-Type"))
	}
	watchLines, eventLines := strings.Split(strings.TrimSpace(string(gw)), "\n"), strings.Split(strings.TrimSpace(string(nd)), "\n")
	if len(watchLines) != len(eventLines) || len(watchLines) < 3 {
		t.Errorf(":watch sent %d lines, /events %d", len(watchLines), len(eventLines))
	} else {
		for i := range watchLines {
			var a, b framepackv1.JobEvent
			if err := protojson.Unmarshal([]byte(watchLines[i]), &a); err != nil {
				t.Fatalf(":watch line %d is not a JobEvent: %v: %.120s", i, err, watchLines[i])
			}
			if err := protojson.Unmarshal([]byte(eventLines[i]), &b); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				a.Time, b.Time = nil, nil // each snapshot is stamped when its watch starts
			}
			if !proto.Equal(&a, &b) {
				t.Errorf("line %d: :watch %.100s, /events %.100s", i, watchLines[i], eventLines[i])
			}
		}
	}
	if _, _, raw := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+":watch?include_previews=nope", "", nil); !strings.Contains(string(raw), "include_previews") {
		t.Errorf(":watch with a bad include_previews: %s", raw)
	}

	// The job's files for the page's gallery: start and end image as uploaded, a thumbnail.
	for _, f := range []string{"image", "end-image"} {
		code, hdr, got := do(t, "GET", d.URL+"/v1/jobs/"+job.GetId()+"/"+f, "", nil)
		if code != http.StatusOK || hdr.Get("Content-Type") != "image/png" || !bytes.Equal(got, image) {
			t.Errorf("%s: %d %q, %d bytes (the upload had %d)", f, code, hdr.Get("Content-Type"), len(got), len(image))
		}
	}
	checkThumbnail(t, d, job.GetId(), second.GetId())

	// Get and list.
	code, _, raw = do(t, "GET", d.URL+"/v1/jobs/"+job.GetId(), "", nil)
	if code != http.StatusOK || jobOf(t, raw).GetState() != framepackv1.JobState_JOB_STATE_SUCCEEDED {
		t.Errorf("get: %d %s", code, raw)
	}
	code, _, raw = do(t, "GET", d.URL+"/v1/jobs?states=JOB_STATE_CANCELLED", "", nil)
	var list framepackv1.ListJobsResponse
	if err := protojson.Unmarshal(raw, &list); code != http.StatusOK || err != nil || len(list.GetJobs()) != 1 || list.GetJobs()[0].GetId() != second.GetId() {
		t.Errorf("list cancelled: %d %s %v", code, raw, err)
	}
	code, _, raw = do(t, "GET", d.URL+"/v1/devices", "", nil)
	if code != http.StatusOK || !strings.Contains(string(raw), `"lane":"cpu"`) {
		t.Errorf("devices: %d %s", code, raw)
	}

	t.Run("bad requests", func(t *testing.T) { badRequests(t, d, image, second.GetId()) })
	t.Run("openapi", func(t *testing.T) { checkOpenAPIServed(t, d) })
	t.Run("metrics", func(t *testing.T) { checkMetrics(t, d, steps) })
}

// badRequests checks that bad input gets a 4xx whose message is the gRPC API's, and that the
// daemon keeps serving.
func badRequests(t *testing.T, d *httpapitest.Daemon, image []byte, cancelledID string) {
	// The gRPC API's own answers, to compare messages with.
	_, grpcBadSpec := d.Jobs.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: image, Spec: &framepackv1.JobSpec{Prompt: "x", TotalSecondLength: 500, Steps: 1000}})
	_, grpcNoJob := d.Jobs.GetJob(t.Context(), &framepackv1.GetJobRequest{JobId: "zzzzzzzzzz"})
	badSpec := &framepackv1.JobSpec{Prompt: "x", TotalSecondLength: 500, Steps: 1000}
	specJSON, _ := protojson.Marshal(badSpec)
	imgJSON, _ := json.Marshal(image)
	notImage, ctNotImage := multipartBody(t, []byte("not an image"), "x.png", httpapitest.TinySpec(1, 1))
	endNotImage, ctEndNotImage := multipartBody(t, image, "x.png", httpapitest.TinySpec(1, 1), []byte("not an image"))

	tests := []struct {
		name, method, path, contentType string
		body                            io.Reader
		status                          int
		message                         string // exact, when set
		contains                        string
	}{
		{name: "spec out of range (json)", method: "POST", path: "/v1/jobs", contentType: "application/json",
			body: strings.NewReader(`{"image":` + string(imgJSON) + `,"spec":` + string(specJSON) + `}`), status: 400, message: status.Convert(grpcBadSpec).Message()},
		{name: "spec out of range (multipart)", method: "POST", path: "/v1/jobs", status: 400, message: status.Convert(grpcBadSpec).Message()},
		{name: "unknown job", method: "GET", path: "/v1/jobs/zzzzzzzzzz", status: 404, message: status.Convert(grpcNoJob).Message()},
		{name: "unknown job video", method: "GET", path: "/v1/jobs/zzzzzzzzzz/video", status: 404, message: status.Convert(grpcNoJob).Message()},
		{name: "unknown job events", method: "GET", path: "/v1/jobs/zzzzzzzzzz/events", status: 404, message: status.Convert(grpcNoJob).Message()},
		{name: "cancelled job has no video", method: "GET", path: "/v1/jobs/" + cancelledID + "/video", status: 400, contains: "has no final video"},
		{name: "section not a number", method: "GET", path: "/v1/jobs/" + cancelledID + "/sections/x/video", status: 400, contains: "want a number"},
		{name: "section not written", method: "GET", path: "/v1/jobs/" + cancelledID + "/sections/7/video", status: 404, contains: "not found"},
		{name: "json syntax", method: "POST", path: "/v1/jobs", contentType: "application/json", body: strings.NewReader(`{"spec":`), status: 400},
		{name: "unknown json field", method: "POST", path: "/v1/jobs", contentType: "application/json", body: strings.NewReader(`{"imagez":"AA=="}`), status: 400},
		{name: "not an image", method: "POST", path: "/v1/jobs", contentType: ctNotImage, body: notImage, status: 400, contains: "image"},
		{name: "end image not an image", method: "POST", path: "/v1/jobs", contentType: ctEndNotImage, body: endNotImage, status: 400, contains: "spec.end_image: not a usable image"},
		{name: "multipart without image", method: "POST", path: "/v1/jobs", contentType: "multipart/form-data; boundary=xx",
			body: strings.NewReader("--xx\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{}\r\n--xx--\r\n"), status: 400, contains: `no "image" part`},
		{name: "multipart unknown part", method: "POST", path: "/v1/jobs", contentType: "multipart/form-data; boundary=xx",
			body: strings.NewReader("--xx\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n--xx--\r\n"), status: 400, contains: `"prompt"`},
		{name: "multipart bad spec", method: "POST", path: "/v1/jobs", contentType: "multipart/form-data; boundary=xx",
			body: strings.NewReader("--xx\r\nContent-Disposition: form-data; name=\"spec\"\r\n\r\n{\"steps\":\"many\"}\r\n--xx--\r\n"), status: 400, contains: "not a JobSpec"},
		{name: "multipart truncated", method: "POST", path: "/v1/jobs", contentType: "multipart/form-data; boundary=xx",
			body: strings.NewReader("--xx\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\nabc"), status: 400},
		{name: "bad previews flag", method: "GET", path: "/v1/jobs/" + cancelledID + "/events?previews=maybe", status: 400, contains: "previews"},
		{name: "bad page size", method: "GET", path: "/v1/jobs?page_size=5000", status: 400, contains: "page_size"},
		{name: "cancel bad id", method: "POST", path: "/v1/jobs/../x:cancel", contentType: "application/json", body: strings.NewReader(`{}`), status: 404},
		{name: "no route", method: "GET", path: "/nothing", status: 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := tc.body
			ct := tc.contentType
			if tc.name == "spec out of range (multipart)" {
				body, ct = multipartBody(t, image, "start.png", badSpec)
			}
			code, _, raw := do(t, tc.method, d.URL+tc.path, ct, body)
			if code != tc.status {
				t.Fatalf("status %d, want %d: %s", code, tc.status, raw)
			}
			e := errorOf(t, raw)
			if e.Message == "" {
				t.Errorf("no message: %s", raw)
			}
			if tc.message != "" && e.Message != tc.message {
				t.Errorf("message %q, want the gRPC API's %q", e.Message, tc.message)
			}
			if tc.contains != "" && !strings.Contains(e.Message, tc.contains) {
				t.Errorf("message %q does not say %q", e.Message, tc.contains)
			}
		})
	}

	// A body over the limit is refused with 413 before it is read (a daemon with a 1 KiB image limit).
	t.Run("too large", func(t *testing.T) {
		small := httpapitest.Start(t, httpapitest.Options{MaxUploadBytes: 1 << 10})
		body, ct := multipartBody(t, bytes.Repeat([]byte("x"), 2<<20), "big.png", httpapitest.TinySpec(1, 1))
		code, _, raw := do(t, "POST", small.URL+"/v1/jobs", ct, body)
		if code != http.StatusRequestEntityTooLarge || !strings.Contains(errorOf(t, raw).Message, "limit") {
			t.Errorf("status %d: %s", code, raw)
		}
		body, ct = multipartBody(t, bytes.Repeat([]byte("x"), 4<<10), "big.png", httpapitest.TinySpec(1, 1))
		code, _, raw = do(t, "POST", small.URL+"/v1/jobs", ct, body)
		if code != http.StatusBadRequest || !strings.Contains(errorOf(t, raw).Message, "more than 1024 bytes") {
			t.Errorf("image over the limit in a small body: %d %s", code, raw)
		}
	})

	// Still serving.
	if code, _, raw := do(t, "GET", d.URL+"/v1/jobs", "", nil); code != http.StatusOK {
		t.Fatalf("after bad requests: %d %s", code, raw)
	}
}

// checkMetrics scrapes /metrics after the job and its cancelled sibling.
func checkMetrics(t *testing.T, d *httpapitest.Daemon, steps int) {
	code, hdr, raw := do(t, "GET", d.URL+"/metrics", "", nil)
	if code != http.StatusOK {
		t.Fatalf("metrics: %d %s", code, raw)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("parse metrics (%s): %v", hdr.Get("Content-Type"), err)
	}
	value := func(name string, labels ...string) float64 {
		t.Helper()
		f, ok := fams[name]
		if !ok {
			t.Errorf("no metric %s", name)
			return math.NaN()
		}
		sum := 0.0
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if labelOf(m, labels[i]) != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
		return sum
	}
	checks := []struct {
		name   string
		labels []string
		want   func(float64) bool
		says   string
	}{
		{"framepack_jobs", []string{"state", "succeeded"}, eq(1), "1"},
		{"framepack_jobs", []string{"state", "cancelled"}, eq(1), "1"},
		{"framepack_queue_depth", nil, eq(0), "0"},
		{"framepack_jobs_ended_total", []string{"state", "succeeded"}, eq(1), "1"},
		{"framepack_jobs_ended_total", []string{"state", "cancelled"}, eq(1), "1"},
		{"framepack_stage_duration_seconds", []string{"stage", "transformer", "backend", "cpu"}, eq(2), "2 (sections)"},
		{"framepack_stage_duration_seconds", []string{"stage", "vae_decode", "backend", "cpu"}, eq(2), "2"},
		{"framepack_stage_duration_seconds", []string{"stage", "text_encode", "backend", "cpu"}, eq(1), "1"},
		{"framepack_sampling_step_seconds", []string{"backend", "cpu"}, eq(float64(2 * steps)), strconv.Itoa(2 * steps)},
		{"framepack_worker_spawns_total", []string{"model", "transformer"}, eq(2), "2"},
		{"framepack_worker_exits_total", []string{"model", "vae", "reason", "done"}, eq(3), "3 (encode, 2 decodes)"},
		{"framepack_conv_decisions_total", []string{"outcome", "success"}, gt(0), "> 0"},
		{"framepack_faults_total", nil, eq(0), "0"},
		{"framepack_device_memory_total_bytes", []string{"lane", "cpu"}, ge(0), ">= 0"},
		{"framepack_lane_state", []string{"lane", "cpu", "state", "healthy"}, eq(1), "1"},
		{"framepack_job_events_total", []string{"kind", "section_video"}, eq(2), "2"},
	}
	for _, c := range checks {
		if v := value(c.name, c.labels...); !c.want(v) {
			t.Errorf("%s%v = %v, want %s", c.name, c.labels, v, c.says)
		}
	}
	// Bounded labels: no job id anywhere.
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "job" || lp.GetName() == "job_id" {
					t.Errorf("%s has a %s label", name, lp.GetName())
				}
			}
		}
	}
}

func labelOf(m *dto.Metric, name string) string {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue()
		}
	}
	return ""
}

func eq(w float64) func(float64) bool { return func(v float64) bool { return v == w } }
func gt(w float64) func(float64) bool { return func(v float64) bool { return v > w } }
func ge(w float64) func(float64) bool { return func(v float64) bool { return v >= w } }

type probeResult struct {
	duration float64
	codec    string
}

// ffprobe reads an MP4's duration and video codec with the real ffprobe.
func ffprobe(t *testing.T, mp4 []byte) probeResult {
	t.Helper()
	path := filepath.Join(t.TempDir(), "v.mp4")
	if err := os.WriteFile(path, mp4, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "ffprobe", "-v", "error", "-select_streams", "v:0",
		"-show_entries", "format=duration:stream=codec_name", "-of", "json", path).Output()
	if err != nil {
		t.Fatalf("ffprobe rejects the video: %v", err)
	}
	var r struct {
		Format  struct{ Duration string } `json:"format"`
		Streams []struct {
			CodecName string `json:"codec_name"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(out, &r); err != nil || len(r.Streams) == 0 {
		t.Fatalf("ffprobe output %s: %v", out, err)
	}
	dur, err := strconv.ParseFloat(r.Format.Duration, 64)
	if err != nil {
		t.Fatalf("ffprobe duration %q", r.Format.Duration)
	}
	return probeResult{duration: dur, codec: r.Streams[0].CodecName}
}

// checkDecodeProgress checks the VAE decode's StageProgress events of a job of n sections:
// every section reports its model runs up to the last (done = total), with an ETA, and the
// share done never goes back.
func checkDecodeProgress(t *testing.T, evs []*framepackv1.StageProgress, n int) {
	t.Helper()
	last := map[uint32]*framepackv1.StageProgress{}
	var frac float32
	for _, p := range evs {
		if p.GetStage() != framepackv1.Stage_STAGE_VAE_DECODE || p.GetDone() < 1 || p.GetDone() > p.GetTotal() || p.GetEta() == nil {
			t.Errorf("decode progress %v", p)
		}
		if prev := last[p.GetSectionIndex()]; prev != nil && p.GetDone() != prev.GetDone()+1 {
			t.Errorf("section %d: decode run %d after %d", p.GetSectionIndex(), p.GetDone(), prev.GetDone())
		}
		if p.GetFraction() < frac || p.GetFraction() > 1 {
			t.Errorf("share done %.3f after %.3f", p.GetFraction(), frac)
		}
		frac = p.GetFraction()
		last[p.GetSectionIndex()] = p
	}
	if len(last) != n {
		t.Fatalf("decode progress for %d sections, want %d", len(last), n)
	}
	for i, p := range last {
		if p.GetDone() != p.GetTotal() {
			t.Errorf("section %d: decode progress ended at %d of %d", i, p.GetDone(), p.GetTotal())
		}
	}
}

// checkThumbnail checks the finished job's thumbnail (a JPEG of its video, at most 320 px on a
// side) and that a job that never ran has none (404 with a message).
func checkThumbnail(t *testing.T, d *httpapitest.Daemon, done, never string) {
	t.Helper()
	code, hdr, raw := do(t, "GET", d.URL+"/v1/jobs/"+done+"/thumbnail", "", nil)
	if code != http.StatusOK || hdr.Get("Content-Type") != "image/jpeg" {
		t.Fatalf("thumbnail: %d %q %.200s", code, hdr.Get("Content-Type"), raw)
	}
	cfg, err := jpeg.DecodeConfig(bytes.NewReader(raw))
	if err != nil || cfg.Width < 16 || cfg.Height < 16 || max(cfg.Width, cfg.Height) > 320 {
		t.Errorf("thumbnail %dx%d: %v", cfg.Width, cfg.Height, err)
	}
	code, _, raw = do(t, "GET", d.URL+"/v1/jobs/"+never+"/thumbnail", "", nil)
	if code != http.StatusNotFound || !strings.Contains(errorOf(t, raw).Message, "no thumbnail") {
		t.Errorf("thumbnail of a job that never ran: %d %s", code, raw)
	}
	code, _, raw = do(t, "GET", d.URL+"/v1/jobs/"+never+"/end-image", "", nil)
	if code != http.StatusOK {
		t.Errorf("end image of the JSON-submitted job: %d %s", code, raw)
	}
}

// checkOpenAPIServed fetches the served OpenAPI document and calls every route it lists with
// an unknown job: each answers from its handler (naming the job, or succeeding), none is
// unrouted.
func checkOpenAPIServed(t *testing.T, d *httpapitest.Daemon) {
	code, _, raw := do(t, "GET", d.URL+"/v1/openapi.json", "", nil)
	var doc struct {
		Info  struct{ Title, Version string }
		Paths map[string]map[string]json.RawMessage
	}
	if err := json.Unmarshal(raw, &doc); code != http.StatusOK || err != nil {
		t.Fatalf("openapi.json: %d %v", code, err)
	}
	if doc.Info.Title != "framepackd REST API" || doc.Info.Version == "" || doc.Info.Version == "version not set" {
		t.Errorf("info %+v", doc.Info)
	}
	const id = "nosuchjob0"
	for path, item := range doc.Paths {
		for method := range item {
			// Presets and batches are named like jobs here: the unknown name is in the answer.
			url := d.URL + strings.NewReplacer("{jobId}", id, "{n}", "0", "{name}", id, "{batchId}", id).Replace(path)
			code, _, raw := do(t, strings.ToUpper(method), url, "application/json", strings.NewReader("{}"))
			switch {
			case code == http.StatusMethodNotAllowed, code == http.StatusNotImplemented:
				t.Errorf("%s %s: %d %s", method, path, code, raw)
			case code == http.StatusNotFound && !strings.Contains(string(raw), id):
				t.Errorf("%s %s: 404 without the job's name (unrouted?): %s", method, path, raw)
			}
		}
	}
}
