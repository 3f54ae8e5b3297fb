package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: the schema of each kind in the manifests is written under kubeconform's file name
// with the definitions it reaches, strict, IntOrString widened; custom resources are left to
// other schema locations and unknown built-in kinds are errors.
func TestRun(t *testing.T) {
	dir := t.TempDir()
	swagger := `{"definitions": {
	  "io.k8s.api.apps.v1.Thing": {"type": "object", "properties": {"spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.ThingSpec"}},
	    "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Thing"}]},
	  "io.k8s.api.apps.v1.ThingSpec": {"type": "object", "properties": {"port": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
	    "labels": {"type": "object", "additionalProperties": {"type": "string"}}, "properties": {"type": "string"}}},
	  "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
	  "io.k8s.api.core.v1.Unused": {"type": "object", "properties": {"x": {"type": "string"}}}
	}}`
	sw := filepath.Join(dir, "swagger.json")
	man := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(sw, []byte(swagger), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(man, []byte("apiVersion: apps/v1\nkind: Thing\nspec:\n  kind: nested\n---\napiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	if err := run([]string{"-swagger", sw, "-out", out, man}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(out, "thing-apps-v1.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Ref         string                    `json:"$ref"`
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Ref != "#/definitions/io.k8s.api.apps.v1.Thing" || len(doc.Definitions) != 3 {
		t.Fatalf("ref %s, definitions %v", doc.Ref, doc.Definitions)
	}
	spec := doc.Definitions["io.k8s.api.apps.v1.ThingSpec"]
	if spec["additionalProperties"] != false {
		t.Errorf("spec not strict: %v", spec)
	}
	props := spec["properties"].(map[string]any)
	if _, ok := props["additionalProperties"]; ok {
		t.Errorf("a property named properties made the property map strict: %v", props)
	}
	if labels := props["labels"].(map[string]any); labels["additionalProperties"] == false {
		t.Errorf("a map was made strict: %v", labels)
	}
	if ios := doc.Definitions["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]; ios["oneOf"] == nil {
		t.Errorf("IntOrString not widened: %v", ios)
	}
	if entries, _ := os.ReadDir(out); len(entries) != 1 {
		t.Errorf("files %v: want the one kind (the custom resource has its own schema)", entries)
	}
	if err := os.WriteFile(man, []byte("apiVersion: v1\nkind: Gadget\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"-swagger", sw, "-out", out, man}); err == nil || !strings.Contains(err.Error(), "not a kind") {
		t.Fatalf("unknown kind: %v", err)
	}
}
