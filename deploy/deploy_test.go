// Package deploy_test checks the container files in deploy/ without a container engine (CI has
// none, and no registry is reachable): the Dockerfiles are parsed (hadolint is not packaged in
// Debian 12) and held to the rules below, the daemon's own flag parser accepts the images'
// command lines, and compose.yaml is read as YAML and checked. The Kubernetes manifests are
// validated by `make deploy-check` (kustomize + kubeconform with offline schemas).
package deploy_test

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/framepackd/framepackd/internal/testbin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd, args string
	line      int
}

// stage is one FROM … [AS name] and its instructions.
type stage struct {
	image, name string
	ins         []instruction
}

// dockerfile is a parsed Dockerfile.
type dockerfile struct {
	globalArgs map[string]string // ARGs before the first FROM, with defaults
	stages     []*stage
	comments   string // every comment, for the documentation checks
}

// parseDockerfile reads a Dockerfile the way the builder does: comment lines dropped (also
// inside continuations), backslash continuations joined, one instruction per logical line.
func parseDockerfile(t *testing.T, path string) *dockerfile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	df := &dockerfile{globalArgs: map[string]string{}}
	var cur strings.Builder
	start := 0
	var comments strings.Builder
	for i, raw := range strings.Split(string(b), "\n") {
		line := strings.TrimSpace(raw)
		if strings.HasPrefix(line, "#") {
			comments.WriteString(line + "\n")
			continue
		}
		if line == "" && cur.Len() == 0 {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		text := cur.String()
		cur.Reset()
		cmd, args, _ := strings.Cut(text, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start}
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			st := &stage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			df.stages = append(df.stages, st)
		case len(df.stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			df.globalArgs[k] = strings.Trim(v, `"`)
		case len(df.stages) == 0:
			t.Fatalf("%s:%d: %s before the first FROM", path, in.line, in.cmd)
		default:
			last := df.stages[len(df.stages)-1]
			last.ins = append(last.ins, in)
		}
	}
	if cur.Len() > 0 {
		t.Fatalf("%s: ends in a continuation line", path)
	}
	df.comments = comments.String()
	return df
}

var argRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// expand replaces ${ARG} with the global defaults; an ARG without one fails.
func (df *dockerfile) expand(t *testing.T, s string) string {
	t.Helper()
	return argRef.ReplaceAllStringFunc(s, func(m string) string {
		name := strings.Trim(m, "${}")
		v, ok := df.globalArgs[name]
		if !ok || v == "" {
			t.Errorf("%s: ARG %s has no default before the first FROM", s, name)
		}
		return v
	})
}

func (st *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range st.ins {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

func jsonArgs(t *testing.T, in instruction) []string {
	t.Helper()
	args := in.args
	if in.cmd == "HEALTHCHECK" {
		_, args, _ = strings.Cut(args, "CMD ")
	}
	var out []string
	if err := json.Unmarshal([]byte(args), &out); err != nil {
		t.Fatalf("line %d: %s is not in exec (JSON) form: %v", in.line, in.cmd, err)
	}
	return out
}

// daemonFlags returns the flags framepackd defines, from its own -h.
func daemonFlags(t *testing.T) string {
	t.Helper()
	bin := testbin.Build(t, "./cmd/framepackd")
	out, err := exec.Command(bin, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("framepackd -h: %v\n%s", err, out)
	}
	return string(out)
}

// TestDockerfiles holds both images to the rules of issue 22 and hadolint's usual ones: pinned
// base tags, multi-stage, apt without recommends and without lists left behind, no ADD of
// URLs, a non-root USER, a gRPC HEALTHCHECK through `framepack health`, the models and state
// as volumes, the workers and the vendor library beside the daemon, and a command line the
// daemon's flag parser accepts.
func TestDockerfiles(t *testing.T) {
	help := daemonFlags(t)
	for _, tc := range []struct {
		vendor  string
		lib     string   // the GPU backend library beside the daemon
		native  string   // the make target building it
		runtime []string // what the runtime image must install or come with
		doc     []string // what the comments must explain
	}{
		{"cuda", "libfpk-cuda.so", "native-cuda", []string{"cudnn-runtime"}, []string{"--gpus", "CUDA_VERSION", "nvidia-smi"}},
		{"rocm", "libfpk-hip.so", "native-hip", []string{"rocm-hip-runtime", "rocblas", "miopen-hip"},
			[]string{"/dev/kfd", "/dev/dri", "render", "video", "HSA_OVERRIDE_GFX_VERSION", "ROCM_VERSION"}},
	} {
		t.Run(tc.vendor, func(t *testing.T) {
			path := filepath.Join(tc.vendor, "Dockerfile")
			df := parseDockerfile(t, path)
			if len(df.stages) < 3 {
				t.Fatalf("%d stages, want native, go build and runtime", len(df.stages))
			}
			names := map[string]bool{}
			for _, st := range df.stages {
				img := df.expand(t, st.image)
				if names[img] {
					continue // a stage built on an earlier one
				}
				repo, tag, ok := strings.Cut(img[strings.LastIndex(img, "/")+1:], ":")
				if !ok || tag == "" || tag == "latest" {
					t.Errorf("FROM %s (%s): pin a tag", st.image, img)
				}
				_ = repo
				if st.name != "" {
					names[st.name] = true
				}
				for _, in := range st.ins {
					switch in.cmd {
					case "ADD":
						if strings.Contains(in.args, "://") {
							t.Errorf("line %d: ADD of a URL; use curl in RUN or COPY", in.line)
						}
					case "RUN":
						if strings.Contains(in.args, "apt-get install") {
							if !strings.Contains(in.args, "--no-install-recommends") || !strings.Contains(in.args, "-y") {
								t.Errorf("line %d: apt-get install without -y --no-install-recommends", in.line)
							}
							if !strings.Contains(in.args, "rm -rf /var/lib/apt/lists/*") {
								t.Errorf("line %d: apt lists left in the layer", in.line)
							}
						}
						if strings.Contains(in.args, "sudo ") {
							t.Errorf("line %d: sudo in a build", in.line)
						}
					case "COPY":
						if from, ok := strings.CutPrefix(in.args, "--from="); ok {
							if src := strings.Fields(from)[0]; !names[src] {
								t.Errorf("line %d: COPY --from=%s: no earlier stage of that name", in.line, src)
							}
						}
					}
				}
			}
			var native *stage
			for _, st := range df.stages {
				for _, in := range st.all("RUN") {
					if strings.Contains(in.args, "make") && strings.Contains(in.args, tc.native) {
						native = st
					}
				}
			}
			if native == nil {
				t.Errorf("no stage builds %s with `make %s`", tc.lib, tc.native)
			}

			final := df.stages[len(df.stages)-1]
			users := final.all("USER")
			if len(users) == 0 {
				t.Fatal("the runtime stage runs as root: no USER")
			}
			if u, _, _ := strings.Cut(users[len(users)-1].args, ":"); u == "root" || u == "0" {
				t.Errorf("USER %s", users[len(users)-1].args)
			}
			hc := final.all("HEALTHCHECK")
			if len(hc) != 1 || !slices.Equal(jsonArgs(t, hc[0])[:2], []string{"framepack", "health"}) {
				t.Errorf("HEALTHCHECK %v: want one, through `framepack health` (gRPC health)", hc)
			}
			var volumes []string
			for _, in := range final.all("VOLUME") {
				volumes = append(volumes, jsonArgs(t, in)...)
			}
			for _, v := range []string{"/var/lib/framepackd/models", "/var/lib/framepackd/state"} {
				if !slices.Contains(volumes, v) {
					t.Errorf("VOLUME lacks %s (%v)", v, volumes)
				}
			}
			var copied strings.Builder
			for _, in := range final.all("COPY") {
				copied.WriteString(in.args + "\n")
			}
			for _, w := range []string{"/out/ /opt/framepackd/bin/", tc.lib + " /opt/framepackd/bin/" + tc.lib} {
				if !strings.Contains(copied.String(), w) {
					t.Errorf("runtime stage does not copy %q (workers and %s beside the daemon):\n%s", w, tc.lib, copied.String())
				}
			}
			var built bool
			for _, st := range df.stages {
				for _, in := range st.all("RUN") {
					if strings.Contains(in.args, "go build") && strings.Contains(in.args, "./workers/...") &&
						strings.Contains(in.args, "./cmd/framepackd") && strings.Contains(in.args, "./cmd/framepack ") {
						built = true
					}
				}
			}
			if !built {
				t.Error("no stage builds the daemon, the CLI and every worker")
			}
			var runtimeText strings.Builder
			runtimeText.WriteString(final.image + "\n")
			for _, in := range final.ins {
				runtimeText.WriteString(in.args + "\n")
			}
			for _, w := range tc.runtime {
				if !strings.Contains(runtimeText.String(), w) {
					t.Errorf("runtime stage lacks %s", w)
				}
			}
			for _, w := range tc.doc {
				if !strings.Contains(df.comments, w) {
					t.Errorf("the Dockerfile's comments do not explain %s", w)
				}
			}
			ep, cmd := final.all("ENTRYPOINT"), final.all("CMD")
			if len(ep) != 1 || len(cmd) != 1 || jsonArgs(t, ep[0])[0] != "framepackd" {
				t.Fatalf("ENTRYPOINT %v CMD %v: want framepackd and its flags", ep, cmd)
			}
			for _, a := range jsonArgs(t, cmd[0]) {
				name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
				if !strings.HasPrefix(a, "--") || !strings.Contains(help, "\n  -"+name+" ") {
					t.Errorf("CMD argument %q: not a framepackd flag", a)
				}
			}
			if tc.vendor == "rocm" {
				var archs string
				for _, in := range native.all("ARG") {
					if v, ok := strings.CutPrefix(in.args, "HIP_ARCHS="); ok {
						archs = strings.Trim(v, `"`)
					}
				}
				want := []string{"gfx1030", "gfx1100", "gfx1101", "gfx1151", "gfx90a", "gfx942"}
				if got := strings.Fields(archs); !slices.Equal(got, want) {
					t.Errorf("HIP_ARCHS %v, want %v", got, want)
				}
			}
		})
	}
}

// TestCompose reads compose.yaml: one daemon per profile (cuda, rocm) from one service
// definition, models and state on volumes, a large /dev/shm, the gRPC health check, and each
// vendor's device options.
func TestCompose(t *testing.T) {
	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type service struct {
		Profiles    []string `yaml:"profiles"`
		Image       string   `yaml:"image"`
		Build       struct{ Context, Dockerfile string }
		ShmSize     string            `yaml:"shm_size"`
		Volumes     []string          `yaml:"volumes"`
		Ports       []string          `yaml:"ports"`
		Devices     []string          `yaml:"devices"`
		GroupAdd    []string          `yaml:"group_add"`
		Environment map[string]string `yaml:"environment"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		Deploy struct {
			Resources struct {
				Reservations struct {
					Devices []struct {
						Driver       string   `yaml:"driver"`
						Capabilities []string `yaml:"capabilities"`
					} `yaml:"devices"`
				} `yaml:"reservations"`
			} `yaml:"resources"`
		} `yaml:"deploy"`
	}
	var c struct {
		Services map[string]service `yaml:"services"`
		Volumes  map[string]any     `yaml:"volumes"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(false)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	byProfile := map[string]service{}
	for name, s := range c.Services {
		if len(s.Profiles) != 1 {
			t.Errorf("service %s: profiles %v, want exactly one (cuda or rocm)", name, s.Profiles)
			continue
		}
		byProfile[s.Profiles[0]] = s
		if _, err := os.Stat(filepath.Join(s.Build.Context, "deploy", strings.TrimPrefix(s.Build.Dockerfile, "deploy/"))); err != nil ||
			s.Build.Context != ".." {
			t.Errorf("service %s: build %+v: %v", name, s.Build, err)
		}
		for _, v := range []string{"models:/var/lib/framepackd/models", "state:/var/lib/framepackd/state"} {
			if !slices.Contains(s.Volumes, v) {
				t.Errorf("service %s: volumes %v lack %s", name, s.Volumes, v)
			}
		}
		if s.ShmSize == "" {
			t.Errorf("service %s: no shm_size (tensors pass through /dev/shm)", name)
		}
		if len(s.Healthcheck.Test) < 3 || s.Healthcheck.Test[1] != "framepack" || s.Healthcheck.Test[2] != "health" {
			t.Errorf("service %s: healthcheck %v", name, s.Healthcheck.Test)
		}
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s: port %s published beyond loopback (the API has no authentication)", name, p)
			}
		}
	}
	if len(byProfile) != 2 {
		t.Fatalf("profiles %v, want cuda and rocm", byProfile)
	}
	cuda, rocm := byProfile["cuda"], byProfile["rocm"]
	if d := cuda.Deploy.Resources.Reservations.Devices; len(d) != 1 || d[0].Driver != "nvidia" || !slices.Contains(d[0].Capabilities, "gpu") {
		t.Errorf("cuda: GPU reservation %+v", d)
	}
	if !slices.Contains(rocm.Devices, "/dev/kfd") || !slices.Contains(rocm.Devices, "/dev/dri") || !slices.Contains(rocm.GroupAdd, "video") ||
		len(rocm.GroupAdd) < 2 {
		t.Errorf("rocm: devices %v groups %v", rocm.Devices, rocm.GroupAdd)
	}
	if _, ok := c.Volumes["models"]; !ok {
		t.Error("no models volume")
	}
	if _, ok := c.Volumes["state"]; !ok {
		t.Error("no state volume")
	}
}

// TestManifestArgs holds every framepackd container in the Kubernetes manifests (base,
// overlays, components) to the daemon's own flag set: a renamed or misspelt flag would make
// every pod exit at start, which kubeconform cannot see.
func TestManifestArgs(t *testing.T) {
	help := daemonFlags(t)
	checked := 0
	err := filepath.WalkDir("kubernetes", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		dec := yaml.NewDecoder(f)
		for {
			var doc any
			if err := dec.Decode(&doc); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			for _, c := range containers(doc) {
				if name, _ := c["name"].(string); name != "framepackd" {
					continue
				}
				args, _ := c["args"].([]any)
				for _, a := range args {
					s, _ := a.(string)
					flag, _, _ := strings.Cut(strings.TrimLeft(s, "-"), "=")
					if !strings.HasPrefix(s, "--") || !strings.Contains(help, "\n  -"+flag+" ") {
						t.Errorf("%s: argument %q is not a framepackd flag", path, s)
					}
					checked++
				}
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 {
		t.Fatal("no framepackd container arguments found in deploy/kubernetes")
	}
}

// containers returns every map found under a "containers" key anywhere in doc.
func containers(doc any) []map[string]any {
	var out []map[string]any
	switch v := doc.(type) {
	case map[string]any:
		for k, x := range v {
			if list, ok := x.([]any); ok && k == "containers" {
				for _, c := range list {
					if m, ok := c.(map[string]any); ok {
						out = append(out, m)
					}
				}
				continue
			}
			out = append(out, containers(x)...)
		}
	case []any:
		for _, x := range v {
			out = append(out, containers(x)...)
		}
	}
	return out
}
