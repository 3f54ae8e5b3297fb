// Package proto_test checks the generated protocol packages: the service
// contracts other packages build on, and that the committed generated code
// matches the .proto sources.
package proto_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	workerv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/worker/v1"
)

// The generated packages register their descriptors on import; these
// references keep the imports.
var (
	_ = framepackv1.File_framepack_v1_job_service_proto
	_ = workerv1.File_framepack_worker_v1_worker_service_proto
)

func TestServiceContracts(t *testing.T) {
	tests := []struct {
		name         string
		service      string
		method       string
		input        string
		output       string
		serverStream bool
	}{
		{"worker load", "framepack.worker.v1.WorkerService", "Load", "framepack.worker.v1.LoadRequest", "framepack.worker.v1.LoadResponse", false},
		{"worker run", "framepack.worker.v1.WorkerService", "Run", "framepack.worker.v1.RunRequest", "framepack.worker.v1.RunEvent", true},
		{"worker stats", "framepack.worker.v1.WorkerService", "Stats", "framepack.worker.v1.StatsRequest", "framepack.worker.v1.StatsResponse", false},
		{"worker probe", "framepack.worker.v1.WorkerService", "Probe", "framepack.worker.v1.ProbeRequest", "framepack.worker.v1.ProbeResponse", false},
		{"submit job", "framepack.v1.JobService", "SubmitJob", "framepack.v1.SubmitJobRequest", "framepack.v1.SubmitJobResponse", false},
		{"get job", "framepack.v1.JobService", "GetJob", "framepack.v1.GetJobRequest", "framepack.v1.GetJobResponse", false},
		{"list jobs", "framepack.v1.JobService", "ListJobs", "framepack.v1.ListJobsRequest", "framepack.v1.ListJobsResponse", false},
		{"cancel job", "framepack.v1.JobService", "CancelJob", "framepack.v1.CancelJobRequest", "framepack.v1.CancelJobResponse", false},
		{"watch job", "framepack.v1.JobService", "WatchJob", "framepack.v1.WatchJobRequest", "framepack.v1.JobEvent", true},
		{"list devices", "framepack.v1.DeviceService", "ListDevices", "framepack.v1.ListDevicesRequest", "framepack.v1.ListDevicesResponse", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(tc.service))
			if err != nil {
				t.Fatalf("find %s: %v", tc.service, err)
			}
			sd, ok := d.(protoreflect.ServiceDescriptor)
			if !ok {
				t.Fatalf("%s is a %T, not a service", tc.service, d)
			}
			md := sd.Methods().ByName(protoreflect.Name(tc.method))
			if md == nil {
				t.Fatalf("%s has no method %s", tc.service, tc.method)
			}
			if got := string(md.Input().FullName()); got != tc.input {
				t.Errorf("input = %s, want %s", got, tc.input)
			}
			if got := string(md.Output().FullName()); got != tc.output {
				t.Errorf("output = %s, want %s", got, tc.output)
			}
			if md.IsStreamingClient() {
				t.Errorf("client streaming, want unary request")
			}
			if got := md.IsStreamingServer(); got != tc.serverStream {
				t.Errorf("server streaming = %v, want %v", got, tc.serverStream)
			}
		})
	}
}

// TestEnumZeroValues checks the style rule that every enum's zero value is
// <ENUM>_UNSPECIFIED, so an unset field never reads as a real value.
func TestEnumZeroValues(t *testing.T) {
	n := 0
	protoregistry.GlobalFiles.RangeFilesByPackage("framepack.v1", func(fd protoreflect.FileDescriptor) bool {
		n += checkEnums(t, fd.Enums())
		n += checkMessageEnums(t, fd.Messages())
		return true
	})
	protoregistry.GlobalFiles.RangeFilesByPackage("framepack.worker.v1", func(fd protoreflect.FileDescriptor) bool {
		n += checkEnums(t, fd.Enums())
		n += checkMessageEnums(t, fd.Messages())
		return true
	})
	if n == 0 {
		t.Fatal("no enums found in framepack.v1 or framepack.worker.v1")
	}
	t.Logf("%d enums checked", n)
}

func checkMessageEnums(t *testing.T, msgs protoreflect.MessageDescriptors) int {
	n := 0
	for i := range msgs.Len() {
		n += checkEnums(t, msgs.Get(i).Enums())
		n += checkMessageEnums(t, msgs.Get(i).Messages())
	}
	return n
}

func checkEnums(t *testing.T, enums protoreflect.EnumDescriptors) int {
	for i := range enums.Len() {
		ed := enums.Get(i)
		zero := ed.Values().ByNumber(0)
		if zero == nil {
			t.Errorf("%s has no zero value", ed.FullName())
			continue
		}
		if !strings.HasSuffix(string(zero.Name()), "_UNSPECIFIED") {
			t.Errorf("%s zero value is %s, want *_UNSPECIFIED", ed.FullName(), zero.Name())
		}
	}
	return enums.Len()
}

// TestGeneratedCodeIsCurrent regenerates the Go code into a temporary
// directory and compares it with proto/gen/go. It needs the pinned tools
// from `make setup` and skips without them.
func TestGeneratedCodeIsCurrent(t *testing.T) {
	if testing.Short() {
		t.Skip("regeneration skipped in -short mode")
	}
	bufPath := findTool(t, "buf")
	findTool(t, "protoc-gen-go")
	findTool(t, "protoc-gen-go-grpc")

	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatalf("repo root: %v", err)
	}
	tmp := t.TempDir()
	cmd := exec.CommandContext(t.Context(), bufPath, "generate", "-o", tmp)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH="+toolPath())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("buf generate: %v\n%s", err, out)
	}
	committed := readTree(t, filepath.Join(root, "proto", "gen", "go"))
	fresh := readTree(t, filepath.Join(tmp, "proto", "gen", "go"))
	if len(fresh) == 0 {
		t.Fatal("buf generate wrote no files")
	}
	for name, want := range fresh {
		got, ok := committed[name]
		if !ok {
			t.Errorf("%s: missing from proto/gen/go (run make proto)", name)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: differs from regenerated code (run make proto with the tools of make setup)", name)
		}
	}
	for name := range committed {
		if _, ok := fresh[name]; !ok {
			t.Errorf("%s: stale, no .proto generates it (run make proto)", name)
		}
	}
	t.Logf("%d generated files compared", len(fresh))
}

// toolPath is PATH with GOPATH/bin in front, where `make setup` installs.
func toolPath() string {
	gopath, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return os.Getenv("PATH")
	}
	return filepath.Join(strings.TrimSpace(string(gopath)), "bin") + string(os.PathListSeparator) + os.Getenv("PATH")
}

func findTool(t *testing.T, name string) string {
	t.Helper()
	for _, dir := range filepath.SplitList(toolPath()) {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	t.Skipf("%s not installed (make setup installs it)", name)
	return ""
}

// readTree returns the generated files (*.pb.go) under dir by relative path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".pb.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		files[rel] = b
		return nil
	})
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	return files
}
