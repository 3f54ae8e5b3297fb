// Package convcache is the convolution decision cache shared by every worker process: for each
// conv shape key it remembers which fallback tier served the shape, which tiers failed there
// and which hung. A tier recorded as hung for a shape is skipped for that shape by every later
// worker.
//
// The cache is one small JSON file. Writers serialise on an flock'ed lock file next to it,
// re-read the file, merge their one change into what they read, and replace the file with an
// atomic rename, so concurrent processes (workers recording decisions, the supervisor's
// watchdog recording hangs) never lose each other's entries and readers never see a torn
// file. The package has no cgo state: the supervisor uses it directly.
package convcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"
)

// fileVersion is the format version written into the file.
const fileVersion = 1

// Entry is what the cache knows about one conv shape key. Tiers are named by their stable
// string names (runtime.Tier.String: "vendor_tuned", "vendor_default", "own_kernel", "cpu").
type Entry struct {
	// Served is the tier that last computed the shape successfully ("" if none yet).
	Served string `json:"served,omitempty"`
	// Failed maps a tier to the error it returned for the shape.
	Failed map[string]string `json:"failed,omitempty"`
	// Hung lists the tiers that hung on the shape (recorded by the watchdog).
	Hung []string `json:"hung,omitempty"`
	// Updated is when the entry last changed.
	Updated time.Time `json:"updated"`
}

// IsHung reports whether tier is recorded as hung.
func (e Entry) IsHung(tier string) bool { return slices.Contains(e.Hung, tier) }

// FailedAt returns the recorded failure of tier, if any.
func (e Entry) FailedAt(tier string) (string, bool) {
	r, ok := e.Failed[tier]
	return r, ok
}

func (e Entry) clone() Entry {
	c := e
	c.Hung = slices.Clone(e.Hung)
	if e.Failed != nil {
		c.Failed = make(map[string]string, len(e.Failed))
		for k, v := range e.Failed {
			c.Failed[k] = v
		}
	}
	return c
}

type fileData struct {
	Version int              `json:"version"`
	Entries map[string]Entry `json:"entries"`
}

// Cache is an open decision cache file. It is safe for concurrent use by goroutines and by
// processes sharing the file.
type Cache struct {
	path string

	// mu protects entries, stamp and loadErr.
	mu      sync.Mutex
	entries map[string]Entry
	stamp   fileStamp
	loadErr error

	now func() time.Time
}

// fileStamp identifies a version of the file cheaply (replaced by rename: new inode).
type fileStamp struct {
	ino   uint64
	size  int64
	mtime int64
}

// Open opens (or prepares to create) the cache file at path; its directory is created if
// missing. A missing file is an empty cache. A file that does not parse is treated as empty
// (the next write replaces it) and reported by LoadError, so a damaged cache never stops a
// worker.
func Open(path string) (*Cache, error) {
	if path == "" {
		return nil, errors.New("open conv cache: empty path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("open conv cache: %w", err)
	}
	c := &Cache{path: path, entries: map[string]Entry{}, now: time.Now}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Path returns the cache file's path.
func (c *Cache) Path() string { return c.path }

// LoadError returns why the last read of the file was ignored (nil if it parsed).
func (c *Cache) LoadError() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.loadErr
}

// Reload re-reads the file if it changed since the last read.
func (c *Cache) Reload() error {
	st, ok, err := stampOf(c.path)
	if err != nil {
		return fmt.Errorf("reload conv cache %s: %w", c.path, err)
	}
	c.mu.Lock()
	same := ok && st == c.stamp
	c.mu.Unlock()
	if same {
		return nil
	}
	entries, st, perr, err := readFile(c.path)
	if err != nil {
		return fmt.Errorf("reload conv cache %s: %w", c.path, err)
	}
	c.mu.Lock()
	c.entries, c.stamp, c.loadErr = entries, st, perr
	c.mu.Unlock()
	return nil
}

// Lookup returns the entry of key as last read or written by this process.
func (c *Cache) Lookup(key string) (Entry, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	return e.clone(), ok
}

// Snapshot returns a copy of every entry.
func (c *Cache) Snapshot() map[string]Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Entry, len(c.entries))
	for k, e := range c.entries {
		out[k] = e.clone()
	}
	return out
}

// Keys returns the recorded shape keys, sorted.
func (c *Cache) Keys() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]string, 0, len(c.entries))
	for k := range c.entries {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// RecordServed records that tier computed key successfully (and clears an older failure of
// that tier there).
func (c *Cache) RecordServed(key, tier string) error {
	return c.update(key, func(e *Entry) {
		e.Served = tier
		delete(e.Failed, tier)
	})
}

// RecordFailed records that tier returned an error for key.
func (c *Cache) RecordFailed(key, tier, reason string) error {
	return c.update(key, func(e *Entry) {
		if e.Failed == nil {
			e.Failed = map[string]string{}
		}
		e.Failed[tier] = reason
	})
}

// MarkHung records that tier hung on key; every later worker skips that tier for key.
func (c *Cache) MarkHung(key, tier string) error {
	return c.update(key, func(e *Entry) {
		if !slices.Contains(e.Hung, tier) {
			e.Hung = append(e.Hung, tier)
			sort.Strings(e.Hung)
		}
		if e.Served == tier {
			e.Served = ""
		}
	})
}

// Forget removes key's entry (an operator clearing a stale decision).
func (c *Cache) Forget(key string) error {
	return c.update(key, nil)
}

// update applies change to key's entry under the file lock: lock, re-read, merge, write a
// temporary file, rename it over the cache, unlock. change nil deletes the entry.
func (c *Cache) update(key string, change func(*Entry)) (err error) {
	if key == "" {
		return errors.New("update conv cache: empty key")
	}
	lock, err := os.OpenFile(c.path+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("update conv cache: %w", err)
	}
	defer lock.Close()
	if err := flock(lock, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("update conv cache: lock %s: %w", lock.Name(), err)
	}
	defer func() {
		if uerr := flock(lock, syscall.LOCK_UN); uerr != nil && err == nil {
			err = fmt.Errorf("update conv cache: unlock: %w", uerr)
		}
	}()
	entries, _, _, err := readFile(c.path)
	if err != nil {
		return fmt.Errorf("update conv cache %s: %w", c.path, err)
	}
	if change == nil {
		delete(entries, key)
	} else {
		e := entries[key]
		change(&e)
		e.Updated = c.now().UTC()
		entries[key] = e
	}
	if err := writeFile(c.path, entries); err != nil {
		return fmt.Errorf("update conv cache %s: %w", c.path, err)
	}
	st, _, err := stampOf(c.path)
	if err != nil {
		return fmt.Errorf("update conv cache %s: %w", c.path, err)
	}
	c.mu.Lock()
	c.entries, c.stamp, c.loadErr = entries, st, nil
	c.mu.Unlock()
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

func stampOf(path string) (fileStamp, bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileStamp{}, false, nil
	}
	if err != nil {
		return fileStamp{}, false, err
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st, true, nil
}

// readFile reads the cache. A missing file is empty; unparsable content is empty with
// parseErr set; err is for I/O trouble only.
func readFile(path string) (entries map[string]Entry, st fileStamp, parseErr, err error) {
	entries = map[string]Entry{}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return entries, fileStamp{}, nil, nil
	}
	if err != nil {
		return nil, fileStamp{}, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fileStamp{}, nil, err
	}
	st = fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	const maxSize = 64 << 20
	if fi.Size() > maxSize {
		return entries, st, fmt.Errorf("conv cache is %d bytes (at most %d)", fi.Size(), maxSize), nil
	}
	raw := make([]byte, fi.Size())
	if _, err := f.ReadAt(raw, 0); err != nil && fi.Size() > 0 {
		return nil, fileStamp{}, nil, err
	}
	var d fileData
	if err := json.Unmarshal(raw, &d); err != nil {
		return entries, st, fmt.Errorf("parse conv cache: %w", err), nil
	}
	if d.Version != fileVersion {
		return entries, st, fmt.Errorf("conv cache version %d, want %d", d.Version, fileVersion), nil
	}
	for k, e := range d.Entries {
		if k != "" {
			entries[k] = e
		}
	}
	return entries, st, nil, nil
}

func writeFile(path string, entries map[string]Entry) error {
	raw, err := json.MarshalIndent(fileData{Version: fileVersion, Entries: entries}, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
