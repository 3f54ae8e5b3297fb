package hfhub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Cache is a hub cache folder (see the package doc for its layout).
type Cache struct {
	// Root is the folder holding models--<org>--<name>/ entries.
	Root string
}

// RepoFolder is the cache entry's folder name of a model repository: models--org--name.
func RepoFolder(repo string) string { return "models--" + strings.ReplaceAll(repo, "/", "--") }

// RepoDir is the cache entry of repo.
func (c Cache) RepoDir(repo string) string { return filepath.Join(c.Root, RepoFolder(repo)) }

// BlobPath is where the file with this ETag is stored.
func (c Cache) BlobPath(repo, etag string) string {
	return filepath.Join(c.RepoDir(repo), "blobs", etag)
}

// SnapshotDir is the snapshot folder of a commit.
func (c Cache) SnapshotDir(repo, commit string) string {
	return filepath.Join(c.RepoDir(repo), "snapshots", commit)
}

// SnapshotPath is a file's link in a commit's snapshot.
func (c Cache) SnapshotPath(repo, commit, path string) string {
	return filepath.Join(c.SnapshotDir(repo, commit), filepath.FromSlash(path))
}

// lockPath is the lock file huggingface_hub takes for a blob (so a Python download of the same
// blob waits for ours, and ours for it).
func (c Cache) lockPath(repo, etag string) string {
	return filepath.Join(c.Root, ".locks", RepoFolder(repo), etag+".lock")
}

// Ref returns the commit refs/<rev> names; ok is false when there is no such ref. A commit
// hash is its own ref.
func (c Cache) Ref(repo, rev string) (string, bool) {
	if isCommit(rev) {
		return rev, true
	}
	b, err := os.ReadFile(filepath.Join(c.RepoDir(repo), "refs", filepath.FromSlash(rev)))
	if err != nil {
		return "", false
	}
	commit := strings.TrimSpace(string(b))
	return commit, isCommit(commit)
}

// WriteRef records that rev names commit (nothing to write when rev is the commit).
func (c Cache) WriteRef(repo, rev, commit string) error {
	if rev == commit {
		return nil
	}
	p := filepath.Join(c.RepoDir(repo), "refs", filepath.FromSlash(rev))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("write ref %s of %s: %w", rev, repo, err)
	}
	// a temporary file of its own: pulls running at once (goroutines or processes) each
	// rename a whole ref into place, none moves another's half-written one
	f, err := os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write ref %s of %s: %w", rev, repo, err)
	}
	_, err = f.WriteString(commit)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write ref %s of %s: %w", rev, repo, err)
	}
	return nil
}

// linkSeq numbers Link's temporary names within the process.
var linkSeq atomic.Int64

// Link makes the snapshot entry of path at commit a relative symlink to the blob etag,
// replacing what was there.
func (c Cache) Link(repo, commit, path, etag string) error {
	dst := c.SnapshotPath(repo, commit, path)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	rel, err := filepath.Rel(filepath.Dir(dst), c.BlobPath(repo, etag))
	if err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	// a link name of its own (as WriteRef's temporary file), so concurrent pulls do not
	// rename each other's links away
	tmp := fmt.Sprintf("%s.tmp-link-%d-%d", dst, os.Getpid(), linkSeq.Add(1))
	if err := os.Symlink(rel, tmp); err != nil {
		return fmt.Errorf("link %s: %w", path, err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("link %s: %w", path, err)
	}
	return nil
}

// linked reports whether the snapshot entry of path at commit points at a blob of size bytes.
func (c Cache) linked(repo, commit, path string, size int64) bool {
	st, err := os.Stat(c.SnapshotPath(repo, commit, path))
	return err == nil && st.Mode().IsRegular() && st.Size() == size
}

// lock takes the blob's lock file (flock, as Python's filelock does), waiting until ctx ends.
func (c Cache) lock(ctx context.Context, repo, etag string) (func(), error) {
	p := c.lockPath(repo, etag)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", p, err)
	}
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() { _ = unix.Flock(int(f.Fd()), unix.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", p, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("lock %s (another download of this file is running): %w", p, context.Cause(ctx))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// hasherFor returns the hash that an ETag names: sha256 for 64 hex digits (an LFS file), the
// git blob sha1 for 40 (a file stored in git), nil when the ETag is neither.
func hasherFor(etag string, size int64) hash.Hash {
	if !isHex(etag) {
		return nil
	}
	switch len(etag) {
	case 64:
		return sha256.New()
	case 40:
		h := sha1.New()
		_, _ = io.WriteString(h, "blob "+strconv.FormatInt(size, 10)+"\x00")
		return h
	}
	return nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// Installed is one repository found in a cache.
type Installed struct {
	// Repo is "org/name".
	Repo string
	// Dir is the cache entry.
	Dir string
	// Refs maps revision names to commits.
	Refs map[string]string
	// Snapshots are the commits that have a snapshot folder, newest modified first.
	Snapshots []string
	// Size is the bytes of the blobs in Dir/blobs (complete ones; partial ones are in Partial).
	Size int64
	// Partial is the bytes of *.incomplete blobs.
	Partial int64
}

// Scan lists the model repositories in the cache.
func (c Cache) Scan() ([]Installed, error) {
	ents, err := os.ReadDir(c.Root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("scan cache %s: %w", c.Root, err)
	}
	var out []Installed
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "models--")
		if !ok || !e.IsDir() {
			continue
		}
		org, name, ok := strings.Cut(rest, "--")
		if !ok {
			continue
		}
		in := Installed{Repo: org + "/" + name, Dir: filepath.Join(c.Root, e.Name()), Refs: map[string]string{}}
		refs := filepath.Join(in.Dir, "refs")
		_ = filepath.WalkDir(refs, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if b, err := os.ReadFile(p); err == nil {
				rel, _ := filepath.Rel(refs, p)
				in.Refs[filepath.ToSlash(rel)] = strings.TrimSpace(string(b))
			}
			return nil
		})
		snaps, _ := os.ReadDir(filepath.Join(in.Dir, "snapshots"))
		type snap struct {
			name string
			mod  time.Time
		}
		var ss []snap
		for _, s := range snaps {
			if info, err := s.Info(); err == nil && s.IsDir() {
				ss = append(ss, snap{s.Name(), info.ModTime()})
			}
		}
		sort.Slice(ss, func(i, j int) bool { return ss[i].mod.After(ss[j].mod) })
		for _, s := range ss {
			in.Snapshots = append(in.Snapshots, s.name)
		}
		blobs, _ := os.ReadDir(filepath.Join(in.Dir, "blobs"))
		for _, b := range blobs {
			info, err := b.Info()
			if err != nil || !info.Mode().IsRegular() {
				continue
			}
			if strings.HasSuffix(b.Name(), ".incomplete") {
				in.Partial += info.Size()
			} else {
				in.Size += info.Size()
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// Snapshot is the commit the cache uses for repo at rev: refs/<rev> when it names a snapshot
// that exists, else the only snapshot. ok is false when there is none.
func (c Cache) Snapshot(repo, rev string) (string, bool) {
	commit, ok := c.Ref(repo, rev)
	if !ok {
		commit = ""
	}
	return EntrySnapshot(c.RepoDir(repo), commit)
}

// EntrySnapshot is the snapshot folder name of the cache entry folder entry (models--org--name):
// name when snapshots/<name> exists, else the only snapshot. ok is false when there is none.
// name is not checked to be a commit hash (Snapshot checks its refs; readers of caches written by
// other tools need not); an empty name means none.
func EntrySnapshot(entry, name string) (string, bool) {
	snapshots := filepath.Join(entry, "snapshots")
	if name != "" {
		if st, err := os.Stat(filepath.Join(snapshots, name)); err == nil && st.IsDir() {
			return name, true
		}
	}
	snaps, err := os.ReadDir(snapshots)
	if err != nil {
		return "", false
	}
	var dirs []string
	for _, s := range snaps {
		if s.IsDir() {
			dirs = append(dirs, s.Name())
		}
	}
	if len(dirs) != 1 {
		return "", false
	}
	return dirs[0], true
}

// BadFile is a file that failed verification.
type BadFile struct {
	// Repo and Path name the file; Blob is the blob it links to.
	Repo, Path, Blob string
	// Problem says what is wrong.
	Problem string
}

// VerifyResult is the outcome of Verify for one snapshot.
type VerifyResult struct {
	// Repo and Commit name the snapshot.
	Repo, Commit string
	// Files is how many files were hashed; Bytes their total size.
	Files int
	Bytes int64
	// Unverifiable are files that are not links to blobs named by a hash (copied in by hand).
	Unverifiable []string
	// Bad are the files whose contents do not match their blob's name, or whose blob is missing.
	Bad []BadFile
}

// Verify re-hashes every file of a snapshot against the ETag its blob is named by. progress,
// when not nil, is told the bytes hashed so far.
func (c Cache) Verify(ctx context.Context, repo, commit string, progress func(path string, done int64)) (VerifyResult, error) {
	res := VerifyResult{Repo: repo, Commit: commit}
	snap := c.SnapshotDir(repo, commit)
	err := filepath.WalkDir(snap, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(snap, p)
		rel = filepath.ToSlash(rel)
		target, err := os.Readlink(p)
		if err != nil {
			res.Unverifiable = append(res.Unverifiable, rel)
			return nil
		}
		etag := filepath.Base(target)
		st, err := os.Stat(p)
		if err != nil {
			res.Bad = append(res.Bad, BadFile{Repo: repo, Path: rel, Blob: etag, Problem: "blob missing"})
			return nil
		}
		h := hasherFor(etag, st.Size())
		if h == nil {
			res.Unverifiable = append(res.Unverifiable, rel)
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("verify %s: %w", p, err)
		}
		n, err := io.Copy(h, &ctxReader{ctx: ctx, r: f, onRead: func(done int64) {
			if progress != nil {
				progress(rel, done)
			}
		}})
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("verify %s: %w", p, err)
		}
		res.Files++
		res.Bytes += n
		if got := hex.EncodeToString(h.Sum(nil)); got != etag {
			res.Bad = append(res.Bad, BadFile{Repo: repo, Path: rel, Blob: etag, Problem: "contents hash to " + got})
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("verify %s at %s: %w", repo, commit, err)
	}
	return res, nil
}

// RemoveBad deletes the blobs and links of bad files, so that the next pull downloads them
// again.
func (c Cache) RemoveBad(commit string, bad []BadFile) error {
	var errs []error
	for _, b := range bad {
		if err := os.Remove(c.BlobPath(b.Repo, b.Blob)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		if err := os.Remove(c.SnapshotPath(b.Repo, commit, b.Path)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ctxReader reads r until ctx ends, reporting the running total.
type ctxReader struct {
	ctx    context.Context
	r      io.Reader
	n      int64
	onRead func(int64)
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	c.n += int64(n)
	if n > 0 && c.onRead != nil {
		c.onRead(c.n)
	}
	return n, err
}

// FreeSpace is the bytes available to an unprivileged user on the file system holding dir (or
// its nearest existing parent).
func FreeSpace(dir string) (uint64, error) {
	for {
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		if err == nil {
			return st.Bavail * uint64(st.Bsize), nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return 0, fmt.Errorf("free space of %s: %w", dir, err)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return 0, fmt.Errorf("free space of %s: %w", dir, err)
		}
		dir = parent
	}
}
