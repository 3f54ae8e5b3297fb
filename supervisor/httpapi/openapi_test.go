package httpapi

import (
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// gatewayRoutes lists the routes of the framepack.v1 services' google.api.http rules, as
// "METHOD /path" with path parameters named as the OpenAPI document names them ({jobId}).
func gatewayRoutes(t *testing.T) []string {
	t.Helper()
	camel := regexp.MustCompile(`_([a-z])`)
	var out []string
	for _, fd := range []protoreflect.FileDescriptor{framepackv1.File_framepack_v1_job_service_proto, framepackv1.File_framepack_v1_device_service_proto,
		framepackv1.File_framepack_v1_preset_service_proto, framepackv1.File_framepack_v1_batch_service_proto} {
		svcs := fd.Services()
		for i := range svcs.Len() {
			ms := svcs.Get(i).Methods()
			for k := range ms.Len() {
				opts, _ := ms.Get(k).Options().(*descriptorpb.MethodOptions)
				rule, _ := proto.GetExtension(opts, annotations.E_Http).(*annotations.HttpRule)
				if rule == nil || rule.GetPattern() == nil {
					continue // GetArtifact: gRPC only
				}
				var method, path string
				switch p := rule.GetPattern().(type) {
				case *annotations.HttpRule_Get:
					method, path = http.MethodGet, p.Get
				case *annotations.HttpRule_Post:
					method, path = http.MethodPost, p.Post
				case *annotations.HttpRule_Delete:
					method, path = http.MethodDelete, p.Delete
				case *annotations.HttpRule_Put:
					method, path = http.MethodPut, p.Put
				case *annotations.HttpRule_Patch:
					method, path = http.MethodPatch, p.Patch
				default:
					t.Fatalf("%s: http rule %T", ms.Get(k).FullName(), p)
				}
				path = camel.ReplaceAllStringFunc(path, func(s string) string { return strings.ToUpper(s[1:]) })
				out = append(out, method+" "+path)
			}
		}
	}
	return out
}

// TestOpenAPIDocumentsEveryRoute: the served document has a title and the daemon's version,
// documents exactly the routes served under /v1 (the gateway's and those written here), and
// documents :watch as the same stream of JobEvents as /events.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	h := &handler{}
	routes := h.routes()
	raw, err := buildOpenAPI("v1.2.3", routes)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Info struct {
			Title, Version string
		}
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
			Produces    []string
			Responses   map[string]struct {
				Schema map[string]any
			}
		}
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Info.Title != "framepackd REST API" || doc.Info.Version != "v1.2.3" {
		t.Errorf("info: title %q, version %q", doc.Info.Title, doc.Info.Version)
	}
	served := gatewayRoutes(t)
	for _, rt := range routes {
		served = append(served, rt.pattern)
	}
	if len(served) < 14 {
		t.Fatalf("only %d routes found: %v", len(served), served)
	}
	want := map[string]bool{}
	for _, r := range served {
		method, path, _ := strings.Cut(r, " ")
		want[strings.ToLower(method)+" "+path] = true
		if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok {
			t.Errorf("%s is served but not documented", r)
		}
	}
	ids := map[string]string{}
	for path, item := range doc.Paths {
		for method, op := range item {
			if !want[method+" "+path] {
				t.Errorf("%s %s is documented but not served", method, path)
			}
			if op.OperationID == "" || ids[op.OperationID] != "" {
				t.Errorf("%s %s: operationId %q missing or used twice", method, path, op.OperationID)
			}
			ids[op.OperationID] = path
		}
	}
	for _, p := range []string{watchPath, "/v1/jobs/{jobId}/events"} {
		op := doc.Paths[p]["get"]
		if ref := op.Responses["200"].Schema["$ref"]; ref != "#/definitions/v1JobEvent" || strings.Join(op.Produces, ",") != "application/x-ndjson,text/event-stream" {
			t.Errorf("%s: 200 schema %v, produces %v; want JobEvent lines as NDJSON or SSE", p, op.Responses["200"].Schema, op.Produces)
		}
	}
}
