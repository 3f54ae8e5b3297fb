package convcache

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
)

func TestRecordLookup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "conv.json")
	c, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Lookup("k"); ok {
		t.Fatal("empty cache has an entry")
	}
	if err := c.RecordFailed("k", "vendor_tuned", "no solution"); err != nil {
		t.Fatal(err)
	}
	if err := c.RecordServed("k", "vendor_default"); err != nil {
		t.Fatal(err)
	}
	if err := c.MarkHung("k", "own_kernel"); err != nil {
		t.Fatal(err)
	}
	if err := c.MarkHung("k", "own_kernel"); err != nil { // idempotent
		t.Fatal(err)
	}
	e, ok := c.Lookup("k")
	if !ok || e.Served != "vendor_default" || !e.IsHung("own_kernel") || len(e.Hung) != 1 {
		t.Fatalf("entry %+v", e)
	}
	if r, ok := e.FailedAt("vendor_tuned"); !ok || r != "no solution" {
		t.Fatalf("failure %q %v", r, ok)
	}
	// hanging at the served tier withdraws it
	if err := c.MarkHung("k", "vendor_default"); err != nil {
		t.Fatal(err)
	}
	if e, _ := c.Lookup("k"); e.Served != "" || !e.IsHung("vendor_default") {
		t.Fatalf("entry after a hang at the served tier: %+v", e)
	}
	// serving clears an old failure of that tier
	if err := c.RecordServed("k", "vendor_tuned"); err != nil {
		t.Fatal(err)
	}
	if e, _ := c.Lookup("k"); e.Served != "vendor_tuned" || len(e.Failed) != 0 {
		t.Fatalf("entry after serving at a failed tier: %+v", e)
	}

	// a second handle (another process) sees it all, from the file
	c2, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	e2, ok := c2.Lookup("k")
	if !ok || e2.Served != "vendor_tuned" || len(e2.Hung) != 2 {
		t.Fatalf("reopened entry %+v", e2)
	}
	if err := c2.Forget("k"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Lookup("k"); ok {
		t.Fatal("forgotten entry still there after reload")
	}
	if err := c.RecordServed("", "cpu"); err == nil {
		t.Fatal("empty key accepted")
	}
	var d fileData
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &d); err != nil || d.Version != fileVersion {
		t.Fatalf("file %s: %v", raw, err)
	}
}

func TestCorruptFileIsIgnored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "conv.json")
	for _, content := range []string{"{not json", `{"version": 99, "entries": {"k": {}}}`, ""} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(path)
		if err != nil {
			t.Fatalf("open %q: %v", content, err)
		}
		if content != "" && c.LoadError() == nil {
			t.Fatalf("%q: no load error", content)
		}
		if len(c.Keys()) != 0 {
			t.Fatalf("%q: entries %v", content, c.Keys())
		}
		if err := c.MarkHung("k", "cpu"); err != nil {
			t.Fatal(err)
		}
		if c.LoadError() != nil {
			t.Fatalf("load error after a good write: %v", c.LoadError())
		}
		c2, err := Open(path)
		if err != nil || c2.LoadError() != nil || !mustLookup(t, c2, "k").IsHung("cpu") {
			t.Fatalf("reopen after repair: %v %v", err, c2.LoadError())
		}
	}
}

func mustLookup(t *testing.T, c *Cache, key string) Entry {
	t.Helper()
	e, ok := c.Lookup(key)
	if !ok {
		t.Fatalf("no entry %q", key)
	}
	return e
}

const (
	envWriter = "FPK_CONVCACHE_WRITER"
	envPath   = "FPK_CONVCACHE_PATH"
)

const writesPerWriter = 20

// TestWriterChild is the body of TestConcurrentProcesses's children; it does nothing alone.
func TestWriterChild(t *testing.T) {
	id := os.Getenv(envWriter)
	if id == "" {
		t.Skip("child of TestConcurrentProcesses")
	}
	c, err := Open(os.Getenv(envPath))
	if err != nil {
		t.Fatal(err)
	}
	for i := range writesPerWriter {
		key := fmt.Sprintf("w%s-%d", id, i)
		if err := c.RecordServed(key, "cpu"); err != nil {
			t.Fatal(err)
		}
		// every writer also touches one shared key
		if err := c.MarkHung("shared", "tier-"+id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestConcurrentProcesses: several processes and goroutines write at once; every write
// survives (lock, re-read, merge, rename) and the file always parses.
func TestConcurrentProcesses(t *testing.T) {
	if os.Getenv(envWriter) != "" {
		t.Skip("in a child")
	}
	path := filepath.Join(t.TempDir(), "conv.json")
	const procs, goroutines = 3, 3
	var wg sync.WaitGroup
	errs := make(chan error, procs+goroutines)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestWriterChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), envWriter+"="+strconv.Itoa(p), envPath+"="+path)
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("writer %d: %v\n%s", p, err, out)
			}
		}()
	}
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := Open(path) // its own handle, as another process would have
			if err != nil {
				errs <- err
				return
			}
			id := strconv.Itoa(procs + g)
			for i := range writesPerWriter {
				if err := c.RecordFailed(fmt.Sprintf("w%s-%d", id, i), "vendor_tuned", "x"); err != nil {
					errs <- err
					return
				}
				if err := c.MarkHung("shared", "tier-"+id); err != nil {
					errs <- err
					return
				}
				if _, err := os.ReadFile(path); err != nil { // readers never see a torn file
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c, err := Open(path)
	if err != nil || c.LoadError() != nil {
		t.Fatalf("final open: %v %v", err, c.LoadError())
	}
	if got, want := len(c.Keys()), (procs+goroutines)*writesPerWriter+1; got != want {
		t.Fatalf("%d entries, want %d", got, want)
	}
	if hung := mustLookup(t, c, "shared").Hung; len(hung) != procs+goroutines {
		t.Fatalf("shared key hung at %v, want %d tiers", hung, procs+goroutines)
	}
	matches, _ := filepath.Glob(path + ".tmp*")
	if len(matches) != 0 {
		t.Fatalf("temporary files left: %v", matches)
	}
}
