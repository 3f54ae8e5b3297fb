package shm_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
)

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

func TestSegmentRoundTrip(t *testing.T) {
	a := shmtest.Arena(t, "job-1")
	path, err := a.NewSegment("latents")
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(a.Dir(), "latents.safetensors") {
		t.Fatalf("segment path %s", path)
	}
	specs := []shm.TensorSpec{
		{Name: "latents", DType: safetensors.F32, Shape: []int64{1, 16, 2, 3}},
		{Name: "mask", DType: safetensors.Bool, Shape: []int64{7}},
		{Name: "empty", DType: safetensors.BF16, Shape: []int64{0, 4}},
		{Name: "scalar", DType: safetensors.I64, Shape: []int64{}},
	}
	w, err := shm.Create(path, specs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + shm.PartialExt); err != nil {
		t.Fatalf("no partial file while writing: %v", err)
	}
	if _, err := shm.Open(path); !errors.Is(err, shm.ErrIncomplete) {
		t.Fatalf("open before commit: want ErrIncomplete, got %v", err)
	}
	// Three ways to fill: in place through the mapping, whole-tensor pwrite, pieces.
	want := make([]float32, 96)
	lat := must(w.Bytes("latents"))
	for i := range want {
		want[i] = float32(i)*0.5 - 3
		binary.LittleEndian.PutUint32(lat[4*i:], math.Float32bits(want[i]))
	}
	if err := w.Write("mask", []byte{1, 0, 1, 1, 0, 0, 1}); err != nil {
		t.Fatal(err)
	}
	s := binary.LittleEndian.AppendUint64(nil, 42)
	if err := w.WriteAt("scalar", s[4:], 4); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteAt("scalar", s[:4], 0); err != nil {
		t.Fatal(err)
	}
	if b, err := w.Bytes("empty"); err != nil || len(b) != 0 {
		t.Fatalf("Bytes of empty tensor: %v, %v", b, err)
	}
	for name, err := range map[string]error{
		"unknown tensor":   w.Write("nope", nil),
		"short write":      w.Write("mask", []byte{1}),
		"write past end":   w.WriteAt("mask", []byte{1, 2}, 6),
		"negative offset":  w.WriteAt("mask", []byte{1}, -1),
		"bytes of unknown": second(w.Bytes("nope")),
	} {
		if err == nil {
			t.Errorf("%s accepted", name)
		}
	}
	seg, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path + shm.PartialExt); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("partial file left after commit: %v", err)
	}
	if _, err := w.Commit(); err == nil {
		t.Fatal("second commit succeeded")
	}
	if err := w.Write("mask", make([]byte, 7)); err == nil {
		t.Fatal("write after commit succeeded")
	}
	if m := mode(t, path); m != 0o600 {
		t.Fatalf("segment mode %v, want 0600", m)
	}
	if m := mode(t, a.Dir()); m != 0o700 {
		t.Fatalf("arena mode %v, want 0700", m)
	}

	m, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if ds := m.Header().DataStart; ds != shm.Align {
		t.Fatalf("data starts at %d, want %d", ds, shm.Align)
	}
	if !reflect.DeepEqual(m.Segment(), seg) || seg.Path != path {
		t.Fatalf("read back %+v, wrote %+v", m.Segment(), seg)
	}
	got, shape, err := m.Float32("latents")
	if err != nil || !slices.Equal(got, want) || !slices.Equal(shape, []int64{1, 16, 2, 3}) {
		t.Fatalf("latents: %v %v %v", got[:4], shape, err)
	}
	if b, _ := m.Bytes("mask"); !bytes.Equal(b, []byte{1, 0, 1, 1, 0, 0, 1}) {
		t.Fatalf("mask: %v", b)
	}
	if v, _, err := m.Int64("scalar"); err != nil || v[0] != 42 {
		t.Fatalf("scalar: %v %v", v, err)
	}
	if ts, ok := seg.Tensor("mask"); !ok || ts.Bytes() != 7 {
		t.Fatalf("Segment.Tensor(mask) = %+v, %v", ts, ok)
	}

	// The mapping outlives the file.
	if err := a.Remove("latents"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("segment still there after Remove: %v", err)
	}
	if got2, _, _ := m.Float32("latents"); !slices.Equal(got2, want) {
		t.Fatal("mapping changed after Remove")
	}
}

func second[T any](_ T, err error) error { return err }

// TestPreallocate checks that Create reuses a partial file laid out for the same specs (no new
// memory, same inode) and lays out again one made for other specs.
func TestPreallocate(t *testing.T) {
	a := shmtest.Arena(t, "job")
	path := must(a.NewSegment("out"))
	specs := []shm.TensorSpec{{Name: "x", DType: safetensors.F32, Shape: []int64{1024}}}
	if err := shm.Preallocate(path, specs); err != nil {
		t.Fatal(err)
	}
	if _, err := shm.Open(path); !errors.Is(err, shm.ErrIncomplete) {
		t.Fatalf("preallocated segment readable: %v", err)
	}
	before, err := os.Stat(path + shm.PartialExt)
	if err != nil {
		t.Fatal(err)
	}
	w, err := shm.Create(path, specs)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path + shm.PartialExt)
	if !os.SameFile(before, after) || after.Size() != shm.Align+4096 {
		t.Fatalf("partial file not reused: size %d", after.Size())
	}
	w.Abort()

	if err := shm.Preallocate(path, specs); err != nil {
		t.Fatal(err)
	}
	other := []shm.TensorSpec{{Name: "x", DType: safetensors.BF16, Shape: []int64{1024}}}
	w, err = shm.Create(path, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write("x", make([]byte, 2048)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	m, err := shm.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if info, _ := m.Info("x"); info.DType != safetensors.BF16 {
		t.Fatalf("relaid segment has dtype %s", info.DType)
	}
	if st, _ := os.Stat(path); st.Size() != shm.Align+2048 {
		t.Fatalf("relaid segment is %d bytes", st.Size())
	}
}

func TestWriteSegmentReadableBySafetensors(t *testing.T) {
	a := shmtest.Arena(t, "job")
	path := must(a.NewSegment("pair"))
	in := []safetensors.Tensor{
		safetensors.FromFloat32("a", []int64{2, 2}, []float32{1, 2, 3, 4}),
		safetensors.FromInt64("idx", []int64{3}, []int64{-1, 0, 9}),
	}
	if _, err := shm.WriteSegment(path, in); err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(path) // a segment is a plain safetensors file
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tn := range in {
		b, err := f.Bytes(tn.Name)
		if err != nil || !bytes.Equal(b, tn.Data) {
			t.Fatalf("%s: %v %v", tn.Name, b, err)
		}
	}
	if _, err := shm.WriteSegment(path, []safetensors.Tensor{{Name: "bad", DType: safetensors.F32, Shape: []int64{2}, Data: []byte{1}}}); err == nil {
		t.Fatal("short data accepted")
	}
}

func TestCreateRejects(t *testing.T) {
	a := shmtest.Arena(t, "job")
	path := must(a.NewSegment("x"))
	tests := []struct {
		name  string
		path  string
		specs []shm.TensorSpec
	}{
		{"partial path", path + shm.PartialExt, nil},
		{"unknown dtype", path, []shm.TensorSpec{{Name: "a", DType: "F8", Shape: []int64{1}}}},
		{"negative dim", path, []shm.TensorSpec{{Name: "a", DType: "F32", Shape: []int64{-1}}}},
		{"duplicate", path, []shm.TensorSpec{{Name: "a", DType: "F32"}, {Name: "a", DType: "F32"}}},
		{"reserved name", path, []shm.TensorSpec{{Name: "__metadata__", DType: "F32"}}},
		{"huge", path, []shm.TensorSpec{{Name: "a", DType: "F32", Shape: []int64{1 << 40, 1 << 40}}}},
		{"bigger than shm", path, []shm.TensorSpec{{Name: "a", DType: "U8", Shape: []int64{1 << 50}}}},
		{"missing dir", filepath.Join(a.Dir(), "no", "x.safetensors"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if w, err := shm.Create(tt.path, tt.specs); err == nil {
				w.Abort()
				t.Fatal("accepted")
			}
			if _, err := os.Stat(path + shm.PartialExt); !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("partial file left behind: %v", err)
			}
		})
	}
}

func TestAbort(t *testing.T) {
	a := shmtest.Arena(t, "job")
	path := must(a.NewSegment("x"))
	w, err := shm.Create(path, []shm.TensorSpec{{Name: "a", DType: "U8", Shape: []int64{10}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Bytes("a"); err == nil {
		t.Fatal("Bytes after Abort")
	}
	left, _ := os.ReadDir(a.Dir())
	for _, e := range left {
		if e.Name() != shm.OwnerFile {
			t.Fatalf("left after Abort: %s", e.Name())
		}
	}
}

// writeRaw writes b as a file in the arena and returns its path.
func writeRaw(t *testing.T, a *shm.Arena, name string, b []byte) string {
	t.Helper()
	path := must(a.NewSegment(name))
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// goodSegment returns the bytes of a valid two-tensor segment.
func goodSegment(t testing.TB) []byte {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "g.safetensors")
	_, err := shm.WriteSegment(path, []safetensors.Tensor{
		safetensors.FromFloat32("a", []int64{3}, []float32{1, 2, 3}),
		safetensors.FromUint8("b", []int64{2, 2}, []byte{1, 2, 3, 4}),
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestOpenRejectsCorruptInput(t *testing.T) {
	a := shmtest.Arena(t, "job")
	good := goodSegment(t)
	hdrLen := binary.LittleEndian.Uint64(good)

	withHeader := func(js string) []byte {
		b := make([]byte, shm.Align+16)
		binary.LittleEndian.PutUint64(b, shm.Align-8)
		copy(b[8:], js)
		for i := 8 + len(js); i < shm.Align; i++ {
			b[i] = ' '
		}
		return b
	}
	var misaligned bytes.Buffer
	if err := safetensors.Encode(&misaligned, []safetensors.Tensor{safetensors.FromFloat32("a", []int64{1}, []float32{1})}, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, safetensors.ErrInvalid},
		{"truncated length", good[:5], safetensors.ErrInvalid},
		{"truncated header", good[:100], safetensors.ErrInvalid},
		{"truncated at data start", good[:8+hdrLen], safetensors.ErrInvalid},
		{"truncated in data", good[:len(good)-1], safetensors.ErrInvalid},
		{"header length past end", append(binary.LittleEndian.AppendUint64(nil, 1<<40), good[8:]...), safetensors.ErrInvalid},
		{"not json", withHeader("not json at all"), safetensors.ErrInvalid},
		{"json array", withHeader(`[1,2]`), safetensors.ErrInvalid},
		{"unknown dtype", withHeader(`{"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}}`), safetensors.ErrInvalid},
		{"offsets past end", withHeader(`{"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}}`), safetensors.ErrInvalid},
		{"size mismatch", withHeader(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`), safetensors.ErrInvalid},
		{"overlap", withHeader(`{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}`), safetensors.ErrInvalid},
		{"misaligned (plain safetensors)", misaligned.Bytes(), shm.ErrMisaligned},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := writeRaw(t, a, fmt.Sprintf("c%d", i), tt.data)
			m, err := shm.Open(path)
			if err == nil {
				m.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("want %v, got %v", tt.want, err)
			}
		})
	}

	t.Run("partial file", func(t *testing.T) {
		path := writeRaw(t, a, "p", nil)
		os.Remove(path)
		if err := os.WriteFile(path+shm.PartialExt, good, 0o600); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{path, path + shm.PartialExt} {
			if _, err := shm.Open(p); !errors.Is(err, shm.ErrIncomplete) {
				t.Fatalf("open %s: want ErrIncomplete, got %v", filepath.Base(p), err)
			}
		}
	})
	t.Run("missing", func(t *testing.T) {
		if _, err := shm.Open(filepath.Join(a.Dir(), "none.safetensors")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("want ErrNotExist, got %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		if _, err := shm.Open(a.Dir()); !errors.Is(err, safetensors.ErrInvalid) {
			t.Fatalf("want ErrInvalid, got %v", err)
		}
	})
}

func TestArenaNames(t *testing.T) {
	r := shmtest.Root(t)
	for _, bad := range []string{"", ".", "..", "a/b", "../x", ".hidden", "x.partial", "a..b", strings.Repeat("a", 129), "sp ace", "é"} {
		if _, err := r.NewArena(bad); !errors.Is(err, shm.ErrInvalidName) {
			t.Errorf("job %q: want ErrInvalidName, got %v", bad, err)
		}
	}
	a, err := r.NewArena("job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := r.NewArena("job-1"); !errors.Is(err, shm.ErrExists) {
		t.Fatalf("second arena for a live job: want ErrExists, got %v", err)
	}
	if _, err := a.NewSegment("../escape"); !errors.Is(err, shm.ErrInvalidName) {
		t.Fatalf("segment ../escape: %v", err)
	}
	p := must(a.NewSegment("s1"))
	if _, err := a.NewSegment("s1"); !errors.Is(err, shm.ErrExists) {
		t.Fatalf("duplicate segment: %v", err)
	}
	must(a.NewSegment("s0"))
	if got := a.Segments(); !slices.Equal(got, []string{"s0", "s1"}) {
		t.Fatalf("segments %v", got)
	}
	// Remove takes a partial file too, and frees the name.
	if err := os.WriteFile(p+shm.PartialExt, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Remove("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p + shm.PartialExt); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("partial file survived Remove")
	}
	if err := a.Remove("s1"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("second Remove: %v", err)
	}
	must(a.NewSegment("s1"))

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("arena directory survived Close")
	}
	if _, err := a.NewSegment("s2"); !errors.Is(err, shm.ErrClosed) {
		t.Fatalf("NewSegment after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The name is free again.
	b, err := r.NewArena("job-1")
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := r.RemoveIfEmpty(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("empty root not removed")
	}
}

func TestOpenRoot(t *testing.T) {
	dir := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := shm.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m := mode(t, r.Dir()); m != 0o700 {
		t.Fatalf("root mode %v after open, want 0700", m)
	}
	if err := r.RemoveIfEmpty(); err != nil {
		t.Fatal(err)
	}

	link := shmtest.Dir()
	t.Cleanup(func() { os.Remove(link) })
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	if _, err := shm.OpenRoot(link); !errors.Is(err, shm.ErrUnsafeRoot) {
		t.Fatalf("symlink root: want ErrUnsafeRoot, got %v", err)
	}
	file := shmtest.Dir()
	t.Cleanup(func() { os.Remove(file) })
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := shm.OpenRoot(file); !errors.Is(err, shm.ErrUnsafeRoot) {
		t.Fatalf("file root: want ErrUnsafeRoot, got %v", err)
	}
	if want := fmt.Sprintf("/dev/shm/framepackd-%d", os.Getuid()); shm.DefaultRoot() != want {
		t.Fatalf("DefaultRoot %s, want %s", shm.DefaultRoot(), want)
	}
}

// TestRemoveStale kills the owner of an arena with SIGKILL and checks that the next supervisor's
// RemoveStale takes the arena, while a live arena and a young ownerless directory stay.
func TestRemoveStale(t *testing.T) {
	r := shmtest.Root(t)
	owner := startHelper(t, "ready", "own", r.Dir(), "dead-job")
	deadDir := filepath.Join(r.Dir(), "dead-job")
	if pid := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(deadDir, shm.OwnerFile))))); pid != fmt.Sprint(owner.Process.Pid) {
		t.Fatalf("owner file says %q, owner is %d", pid, owner.Process.Pid)
	}

	live, err := r.NewArena("live-job")
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	young := filepath.Join(r.Dir(), "young-ownerless")
	old := filepath.Join(r.Dir(), "old-ownerless")
	for _, d := range []string{young, old} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}

	// While the owner lives, its arena is not stale.
	removed, err := r.RemoveStale()
	if err != nil || !slices.Equal(removed, []string{old}) {
		t.Fatalf("with live owner: removed %v, %v", removed, err)
	}
	if _, err := r.NewArena("dead-job"); !errors.Is(err, shm.ErrExists) {
		t.Fatalf("taking a live owner's job: %v", err)
	}

	owner.Process.Signal(syscall.SIGKILL)
	owner.Wait()
	removed, err = r.RemoveStale()
	if err != nil || !slices.Equal(removed, []string{deadDir}) {
		t.Fatalf("after owner died: removed %v, %v", removed, err)
	}
	for _, d := range []string{live.Dir(), young} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("%s removed: %v", d, err)
		}
	}
}

// TestNewArenaTakesOverDeadJob checks that creating an arena whose directory a dead owner left
// replaces it.
func TestNewArenaTakesOverDeadJob(t *testing.T) {
	r := shmtest.Root(t)
	owner := startHelper(t, "ready", "own", r.Dir(), "j")
	owner.Process.Signal(syscall.SIGKILL)
	owner.Wait()
	a, err := r.NewArena("j")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := os.Stat(filepath.Join(a.Dir(), "s.safetensors")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dead owner's segment survived: %v", err)
	}
}

// TestCrossProcess writes a segment in one process and maps and reads it in another, both ways.
func TestCrossProcess(t *testing.T) {
	a := shmtest.Arena(t, "xproc")
	const n = 3<<20 + 17

	// Child writes, we read.
	childPath := must(a.NewSegment("from-child"))
	if out, err := helperCmd(t, "write", childPath, fmt.Sprint(n)).CombinedOutput(); err != nil {
		t.Fatalf("child write: %v: %s", err, out)
	}
	m, err := shm.Open(childPath)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	want := make([]byte, n)
	fillPattern(want, 7)
	if got, _ := m.Bytes("x"); !bytes.Equal(got, want) {
		t.Fatal("data written by the child differs")
	}

	// We write, child reads.
	ourPath := must(a.NewSegment("from-parent"))
	fillPattern(want, 99)
	in := []safetensors.Tensor{
		safetensors.FromUint8("big", []int64{n}, want),
		safetensors.FromFloat32("small", []int64{2}, []float32{1.5, -2}),
	}
	if _, err := shm.WriteSegment(ourPath, in); err != nil {
		t.Fatal(err)
	}
	out, err := helperCmd(t, "read", ourPath).Output()
	if err != nil {
		t.Fatalf("child read: %v", err)
	}
	var expect strings.Builder
	for _, tn := range in {
		sum := sha256.Sum256(tn.Data)
		fmt.Fprintf(&expect, "%s %s\n", tn.Name, hex.EncodeToString(sum[:]))
	}
	if string(out) != expect.String() {
		t.Fatalf("child read:\n%s\nwant:\n%s", out, expect.String())
	}
}
