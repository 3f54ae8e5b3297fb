// Command k8sschema writes kubeconform's JSON schemas for the kinds some manifests use, from
// the Kubernetes OpenAPI v2 document (api/openapi-spec/swagger.json of the k8s.io/kubernetes
// module, which `make setup` fetches through the Go module proxy), so that `make deploy-check`
// validates the manifests offline: kubeconform's default schema location is GitHub, which CI
// cannot reach.
//
// Usage:
//
//	k8sschema -swagger swagger.json -out DIR manifest.yaml…
//
// For each apiVersion/kind in the manifests (top-level keys of each YAML document, as
// `kustomize build` prints them) it writes DIR/<kind>-<group>-<version>.json (kubeconform's
// {{.ResourceKind}}{{.KindSuffix}}): the kind's definition and every definition it reaches,
// made strict the way openapi2jsonschema --strict does (objects with properties reject others),
// with IntOrString and Quantity accepting numbers as well as strings. A kind the document does
// not define is an error.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "k8sschema:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("k8sschema", flag.ContinueOnError)
	swagger := fs.String("swagger", "", "Kubernetes OpenAPI v2 document (swagger.json)")
	out := fs.String("out", "", "directory to write the schemas to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *swagger == "" || *out == "" || fs.NArg() == 0 {
		return errors.New("usage: k8sschema -swagger swagger.json -out DIR manifest.yaml…")
	}
	defs, err := readDefinitions(*swagger)
	if err != nil {
		return err
	}
	byGVK := indexGVK(defs)
	wanted := map[gvk]bool{}
	for _, m := range fs.Args() {
		kinds, err := manifestKinds(m)
		if err != nil {
			return err
		}
		for _, k := range kinds {
			wanted[k] = true
		}
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", *out, err)
	}
	for k := range wanted {
		name, ok := byGVK[k]
		if !ok {
			if k.group() == "" || strings.HasSuffix(k.group(), ".k8s.io") || !strings.Contains(k.group(), ".") {
				return fmt.Errorf("%s %s: not a kind of this Kubernetes version", k.APIVersion, k.Kind)
			}
			continue // a custom resource: its schema comes from elsewhere (-schema-location)
		}
		doc := map[string]any{
			"$schema":     "http://json-schema.org/draft-07/schema#",
			"$ref":        "#/definitions/" + name,
			"definitions": closure(defs, name),
		}
		b, err := json.Marshal(doc)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		p := filepath.Join(*out, k.fileName())
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	return nil
}

// gvk is an apiVersion and a kind.
type gvk struct{ APIVersion, Kind string }

func (k gvk) group() string {
	if g, _, ok := strings.Cut(k.APIVersion, "/"); ok {
		return g
	}
	return ""
}

// fileName is kubeconform's {{.ResourceKind}}{{.KindSuffix}}.json: "statefulset-apps-v1.json",
// "service-v1.json".
func (k gvk) fileName() string {
	g, v, ok := strings.Cut(k.APIVersion, "/")
	if !ok {
		return strings.ToLower(k.Kind) + "-" + k.APIVersion + ".json"
	}
	g, _, _ = strings.Cut(g, ".")
	return strings.ToLower(k.Kind) + "-" + g + "-" + v + ".json"
}

func readDefinitions(path string) (map[string]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var doc struct {
		Definitions map[string]map[string]any `json:"definitions"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("parse %s: %w", path, err)
	}
	if len(doc.Definitions) == 0 {
		return nil, fmt.Errorf("%s: no definitions", path)
	}
	return doc.Definitions, nil
}

// indexGVK maps each apiVersion/kind to its definition's name.
func indexGVK(defs map[string]map[string]any) map[gvk]string {
	out := map[gvk]string{}
	for name, d := range defs {
		list, _ := d["x-kubernetes-group-version-kind"].([]any)
		for _, e := range list {
			m, _ := e.(map[string]any)
			g, _ := m["group"].(string)
			v, _ := m["version"].(string)
			k, _ := m["kind"].(string)
			av := v
			if g != "" {
				av = g + "/" + v
			}
			// The kind's own definition wins over lists and events that share the gvk tag.
			if prev, ok := out[gvk{av, k}]; ok && strings.HasSuffix(prev, "."+k) {
				continue
			}
			out[gvk{av, k}] = name
		}
	}
	return out
}

// manifestKinds returns the apiVersion/kind of every document of a multi-document YAML file
// whose top-level keys start at column 0 (kustomize's output).
func manifestKinds(path string) ([]gvk, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}
	defer f.Close()
	var out []gvk
	var cur gvk
	flush := func() {
		if cur.Kind != "" && cur.APIVersion != "" {
			out = append(out, cur)
		}
		cur = gvk{}
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "---"):
			flush()
		case strings.HasPrefix(line, "apiVersion:"):
			cur.APIVersion = unquote(strings.TrimPrefix(line, "apiVersion:"))
		case strings.HasPrefix(line, "kind:"):
			cur.Kind = unquote(strings.TrimPrefix(line, "kind:"))
		}
	}
	flush()
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no Kubernetes objects", path)
	}
	return out, nil
}

func unquote(s string) string { return strings.Trim(strings.TrimSpace(s), `"'`) }

// closure returns the definitions reachable from name, strict and with the string-or-number
// types widened.
func closure(defs map[string]map[string]any, name string) map[string]any {
	out := map[string]any{}
	queue := []string{name}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if _, done := out[n]; done {
			continue
		}
		d, ok := defs[n]
		if !ok {
			continue
		}
		var refs []string
		out[n] = transform(n, d, &refs)
		sort.Strings(refs)
		queue = append(queue, refs...)
	}
	return out
}

const refPrefix = "#/definitions/"

// transform copies a schema: refs collected, objects with properties made strict, and
// IntOrString/Quantity widened.
func transform(name string, s map[string]any, refs *[]string) map[string]any {
	switch name {
	case "io.k8s.apimachinery.pkg.util.intstr.IntOrString":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "integer"}}}
	case "io.k8s.apimachinery.pkg.api.resource.Quantity":
		return map[string]any{"oneOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "number"}}}
	}
	return walk(s, refs).(map[string]any)
}

func walk(v any, refs *[]string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x)+1)
		for k, e := range x {
			if k == "$ref" {
				if r, ok := e.(string); ok && strings.HasPrefix(r, refPrefix) {
					*refs = append(*refs, strings.TrimPrefix(r, refPrefix))
				}
			}
			if m, ok := e.(map[string]any); ok && (k == "properties" || k == "patternProperties") {
				props := make(map[string]any, len(m)) // names → schemas, not a schema itself
				for pn, ps := range m {
					props[pn] = walk(ps, refs)
				}
				out[k] = props
				continue
			}
			out[k] = walk(e, refs)
		}
		if _, hasProps := x["properties"]; hasProps {
			if _, set := x["additionalProperties"]; !set {
				out["additionalProperties"] = false
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = walk(e, refs)
		}
		return out
	}
	return v
}
