package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/framepackd/framepackd/proto/gen/openapiv2"
)

// route is one endpoint written here rather than generated (beside the gateway's), with its
// OpenAPI operation. pattern is a ServeMux pattern whose wildcards carry the names the
// generated document uses ({jobId}), so the path of the document is the pattern's path.
type route struct {
	pattern string
	handler http.HandlerFunc
	// op is the OpenAPI v2 operation; nil for a method the gateway's document already has
	// (POST /v1/jobs: op is merged into it instead, see amend).
	op map[string]any
	// amend, when set, edits the generated operation of this method and path.
	amend func(op map[string]any)
}

// jobIDParam is the {jobId} path parameter, as the generated document names it.
var jobIDParam = map[string]any{"name": "jobId", "in": "path", "required": true, "type": "string", "description": "the job's id"}

// errorResponse is the error every /v1 route answers with: the gRPC status as JSON.
var errorResponse = map[string]any{"description": "The gRPC status as JSON ({code, message, details}) with the HTTP status its code maps to.",
	"schema": map[string]any{"$ref": "#/definitions/rpcStatus"}}

// eventStream documents the watch streams (/events and :watch), framed alike.
func eventStream(id, summary, previewsParam string) map[string]any {
	return map[string]any{
		"summary": summary,
		"description": "A stream of JobEvent objects: the job's snapshot first, then the events it already had (replay: true), " +
			"then live ones, ending after jobFinished, jobFailed or jobCancelled. With Accept: text/event-stream it is " +
			"Server-Sent Events (the event type is the payload's field name: snapshot, stageStarted, samplingStep, " +
			"stageProgress, preview, sectionVideo, ...; the data a JobEvent as JSON; a comment line every 15 s); " +
			"otherwise NDJSON, one JobEvent a line. An error after the first event ends the stream with a final " +
			"\"error\" event (SSE) or a {\"error\": Status} line (NDJSON).",
		"operationId": id,
		"produces":    []string{"application/x-ndjson", "text/event-stream"},
		"parameters": []any{jobIDParam,
			map[string]any{"name": previewsParam, "in": "query", "required": false, "type": "boolean",
				"description": "true adds Preview events (a PNG of the denoised latents after each sampling step)"}},
		"responses": map[string]any{
			"200":     map[string]any{"description": "The job's events (streaming).", "schema": map[string]any{"$ref": "#/definitions/v1JobEvent"}},
			"default": errorResponse,
		},
		"tags": []string{"JobService"},
	}
}

// fileOp documents a GET that serves one file of a job.
func fileOp(id, summary, description string, produces []string, params ...map[string]any) map[string]any {
	ps := []any{jobIDParam}
	for _, p := range params {
		ps = append(ps, p)
	}
	return map[string]any{
		"summary": summary, "description": description, "operationId": id, "produces": produces, "parameters": ps,
		"responses": map[string]any{
			"200":     map[string]any{"description": "The file.", "schema": map[string]any{"type": "file"}},
			"default": errorResponse,
		},
		"tags": []string{"JobService"},
	}
}

// downloadParam is ?download=true on a video route.
var downloadParam = map[string]any{"name": "download", "in": "query", "required": false, "type": "boolean",
	"description": "true serves the file as an attachment (Content-Disposition) instead of inline"}

// routes are the endpoints written here, in the order the mux registers them.
func (h *handler) routes() []route {
	video := "Range requests, Last-Modified and conditional requests are served (http.ServeContent)."
	return []route{
		{pattern: "POST /v1/jobs", handler: h.submit, amend: func(op map[string]any) {
			op["consumes"] = []string{"application/json", "multipart/form-data"}
			op["description"] = "The body is a SubmitJobRequest as JSON (image in base64), or multipart/form-data with an " +
				"\"image\" file part, a \"spec\" part holding the JobSpec as JSON and an optional \"end_image\" file part; " +
				"also a \"keyframe\" file part for each spec.keyframes entry without an image (in order) and an \"input_video\" " +
				"file part (a video to extend: then no \"image\" part)."
		}},
		{pattern: "POST /v1/batches", handler: h.submitBatch, amend: func(op map[string]any) {
			op["consumes"] = []string{"application/json", "multipart/form-data"}
			op["description"] = "The body is a SubmitBatchRequest as JSON, or multipart/form-data with one \"image\" file " +
				"part per job, a \"spec\" part holding the JobSpec all the jobs share as JSON and an optional \"batch_id\" part."
		}},
		{pattern: "GET /v1/jobs/{jobId}/events", handler: h.events,
			op: eventStream("HTTP_WatchJobEvents", "watch a job's events as SSE or NDJSON", "previews")},
		{pattern: "GET /v1/jobs/{jobId}/video", handler: h.finalVideo,
			op: fileOp("HTTP_GetVideo", "the finished job's MP4", "FAILED_PRECONDITION while the job has no final video. "+video,
				[]string{"video/mp4"}, downloadParam)},
		{pattern: "GET /v1/jobs/{jobId}/sections/{n}/video", handler: h.sectionVideo,
			op: fileOp("HTTP_GetSectionVideo", "the MP4 written after section n (the video so far)",
				"NOT_FOUND once a later section replaced it (unless the daemon keeps section videos). "+video,
				[]string{"video/mp4"}, map[string]any{"name": "n", "in": "path", "required": true, "type": "integer", "format": "int32",
					"description": "the section, 0-based in generation order"}, downloadParam)},
		{pattern: "GET /v1/jobs/{jobId}/image", handler: h.artifact("image"),
			op: fileOp("HTTP_GetImage", "the job's start image, as submitted", "PNG, JPEG or WebP.", []string{"image/png", "image/jpeg", "image/webp"})},
		{pattern: "GET /v1/jobs/{jobId}/end-image", handler: h.artifact("end-image"),
			op: fileOp("HTTP_GetEndImage", "the job's end image, as submitted", "NOT_FOUND for a job without one.", []string{"image/png", "image/jpeg", "image/webp"})},
		{pattern: "GET /v1/jobs/{jobId}/thumbnail", handler: h.artifact("thumbnail"),
			op: fileOp("HTTP_GetThumbnail", "a small JPEG of the job's video so far",
				"The middle one of the frames the newest section added, at most 320 pixels on a side; NOT_FOUND before the first section is done.",
				[]string{"image/jpeg"})},
		{pattern: "POST /v1/session", handler: h.session, op: map[string]any{
			"summary":     "turn the bearer token into a session cookie",
			"description": "Checks the Authorization: Bearer token and sets it as an HttpOnly, SameSite=Strict cookie, for clients (the web page's <video> and EventSource) that cannot send a header. 204 without a token configured.",
			"operationId": "HTTP_CreateSession",
			"responses":   map[string]any{"204": map[string]any{"description": "Signed in (or no token is needed)."}, "default": errorResponse},
			"tags":        []string{"Session"},
		}},
		{pattern: "GET /v1/openapi.json", handler: h.openAPI, op: map[string]any{
			"summary": "this document", "operationId": "HTTP_GetOpenAPI", "produces": []string{"application/json"},
			"responses": map[string]any{"200": map[string]any{"description": "The OpenAPI v2 document."}},
			"tags":      []string{"Session"},
		}},
	}
}

// watchPath is the gateway's route of WatchJob, served by events (see serveGateway).
const watchPath = "/v1/jobs/{jobId}:watch"

// buildOpenAPI returns the OpenAPI v2 document of everything served under /v1: the one
// protoc-gen-openapiv2 generated from the services' http rules, with a title, the given
// version, WatchJob's route framed as /events is (it is served by the same handler), and the
// routes written here.
func buildOpenAPI(version string, routes []route) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(openapiv2.JSON, &doc); err != nil {
		return nil, fmt.Errorf("openapi: generated document: %w", err)
	}
	if version == "" {
		version = "devel"
	}
	doc["info"] = map[string]any{
		"title": "framepackd REST API",
		"description": "FramePack image-to-video jobs over HTTP: the framepack.v1 gRPC API through grpc-gateway, plus " +
			"multipart upload, event streams and file downloads. Every error is the gRPC status as JSON.",
		"version": version,
	}
	paths, ok := doc["paths"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("openapi: generated document has no paths")
	}
	watch, ok := paths[watchPath].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("openapi: generated document lacks %s", watchPath)
	}
	summary, _ := watch["get"].(map[string]any)["summary"].(string)
	w := eventStream("JobService_WatchJob", summary, "includePreviews")
	watch["get"] = w
	tags, _ := doc["tags"].([]any)
	doc["tags"] = append(tags, map[string]any{"name": "Session", "description": "Signing in from a browser, and this document."})
	for _, rt := range routes {
		method, path, ok := strings.Cut(rt.pattern, " ")
		if !ok {
			return nil, fmt.Errorf("openapi: route %q has no method", rt.pattern)
		}
		method = strings.ToLower(method)
		item, _ := paths[path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[path] = item
		}
		switch {
		case rt.amend != nil:
			op, ok := item[method].(map[string]any)
			if !ok {
				return nil, fmt.Errorf("openapi: no generated %s %s to amend", method, path)
			}
			rt.amend(op)
		case rt.op != nil:
			item[method] = maps.Clone(rt.op)
		default:
			return nil, fmt.Errorf("openapi: route %q is not documented", rt.pattern)
		}
	}
	return json.MarshalIndent(doc, "", "  ")
}

// openAPI serves the document.
func (h *handler) openAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(h.openapi)
}
