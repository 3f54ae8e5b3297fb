package hfhub

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultRevision is the revision pulled when a Want names none.
const DefaultRevision = "main"

// Want is a repository to pull and which of its files.
type Want struct {
	// Repo is "org/name".
	Repo string
	// Revision is a branch, tag or commit; empty means main.
	Revision string
	// Include selects files: an entry ending in "/" takes every file under that folder, any
	// other entry is a path.Match pattern on the whole path ("*.safetensors" matches top-level
	// files only). Every entry must match at least one file. Empty (and no Optional) takes
	// every file.
	Include []string
	// Optional are more entries like Include's that may match nothing.
	Optional []string
}

func (w Want) rev() string {
	if w.Revision == "" {
		return DefaultRevision
	}
	return w.Revision
}

// includes reports whether p is selected, and by which Include entry (-1: another).
func (w Want) includes(p string) (int, bool) {
	if len(w.Include) == 0 && len(w.Optional) == 0 {
		return -1, true
	}
	for i, inc := range append(w.Include[:len(w.Include):len(w.Include)], w.Optional...) {
		if i >= len(w.Include) {
			i = -1
		}
		if strings.HasSuffix(inc, "/") {
			if strings.HasPrefix(p, inc) {
				return i, true
			}
			continue
		}
		if ok, _ := path.Match(inc, p); ok {
			return i, true
		}
	}
	return 0, false
}

// Item is one file of a Plan.
type Item struct {
	// Repo, Revision, Commit and Path name the file.
	Repo, Revision, Commit, Path string
	// ETag is the blob's name: the sha256 of an LFS file, the git blob sha1 of another.
	ETag string
	// Hash is what the contents must hash to: the sha256 of an LFS file (64 hex digits), the
	// git blob sha1 (40) of another, as the file list gives them; empty when neither is known
	// (only the size is checked then).
	Hash string
	// Size is the file's size in bytes.
	Size int64
	// LFS is set for files stored with git-lfs (verified by sha256).
	LFS bool
	// Location is where the file is downloaded from (the LFS host for LFS files); Pull
	// refreshes it when it retries a file.
	Location string
	// Present: the snapshot already links the complete file.
	Present bool
	// BlobPresent: the blob is complete but not linked into this snapshot yet.
	BlobPresent bool
	// Have is the size of a partial blob left by an earlier pull (resumed).
	Have int64
}

// PlannedRepo is a repository of a Plan at the commit its revision resolved to.
type PlannedRepo struct {
	Repo, Revision, Commit string
}

// Plan is what a pull will do: the files, which are there, and how many bytes remain.
type Plan struct {
	// Repos are the repositories, in the order asked.
	Repos []PlannedRepo
	// Items are the files.
	Items []Item
	// Total is the size of every file; Need the bytes still to download.
	Total, Need int64
}

// FileState is where a file of a pull stands.
type FileState int

// File states, in order.
const (
	FileQueued FileState = iota
	FileDownloading
	FileVerifying
	FileDone
	FileFailed
)

// String names the state.
func (s FileState) String() string {
	return [...]string{"queued", "downloading", "verifying", "done", "failed"}[s]
}

// Progress is one report of a pull. Reports come one at a time (never concurrently).
type Progress struct {
	// Repo and Path name the file; State is where it stands; Err is set when it failed.
	Repo, Path string
	State      FileState
	Err        error
	// Done and Size are the file's bytes downloaded (or already there) and its size.
	Done, Size int64
	// TotalDone and Total are the same over every file of the pull.
	TotalDone, Total int64
	// FilesDone and Files count the files.
	FilesDone, Files int
}

// Puller downloads repositories into a Cache.
type Puller struct {
	// Client talks to the hub.
	Client *Client
	// Cache is where the files go.
	Cache Cache
	// Offline forbids network access: a pull then only checks the cache.
	Offline bool
	// Concurrency is how many files download at once (default 4).
	Concurrency int
	// Retries is how many times a file is retried (resuming) after a transfer error in the
	// same pull (default 3; negative: none).
	Retries int
	// Progress, when set, is told of every file's progress.
	Progress func(Progress)
	// FreeSpace reports the free bytes where the cache lives (default: FreeSpace).
	FreeSpace func(dir string) (uint64, error)
	// Backoff is the wait before the n-th retry (default: 1 s, doubling, at most 15 s).
	Backoff func(n int) time.Duration
	// StallTimeout abandons a transfer that received nothing for this long (default 60 s);
	// it is then retried like a dropped connection.
	StallTimeout time.Duration
}

// errStalled: a transfer received nothing for StallTimeout.
var errStalled = errors.New("no data received")

func (p *Puller) stallTimeout() time.Duration {
	if p.StallTimeout > 0 {
		return p.StallTimeout
	}
	return 60 * time.Second
}

// Plan resolves each Want to a commit, lists the files it selects and checks which are in the
// cache already. Offline, it reads only the cache.
func (p *Puller) Plan(ctx context.Context, wants []Want) (*Plan, error) {
	plan := &Plan{}
	for _, w := range wants {
		var err error
		if p.Offline {
			err = p.planOffline(plan, w)
		} else {
			err = p.planOnline(ctx, plan, w)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, it := range plan.Items {
		plan.Total += it.Size
		if !it.Present && !it.BlobPresent {
			plan.Need += it.Size - it.Have
		}
	}
	return plan, nil
}

func (p *Puller) planOnline(ctx context.Context, plan *Plan, w Want) error {
	var info *RepoInfo
	err := p.again(ctx, func() (err error) {
		info, err = p.Client.Info(ctx, w.Repo, w.rev())
		return err
	})
	if err != nil {
		return err
	}
	plan.Repos = append(plan.Repos, PlannedRepo{Repo: w.Repo, Revision: w.rev(), Commit: info.Commit})
	matched := make([]bool, len(w.Include))
	var files []Sibling
	for _, s := range info.Files {
		i, ok := w.includes(s.Path)
		if !ok {
			continue
		}
		if i >= 0 {
			matched[i] = true
		}
		files = append(files, s)
	}
	for i, m := range matched {
		if !m {
			return fmt.Errorf("repository %s at %s (%s): %w: no file matches %q", w.Repo, w.rev(), info.Commit, ErrNotFound, w.Include[i])
		}
	}
	if len(files) == 0 {
		return fmt.Errorf("repository %s at %s: %w: no files", w.Repo, w.rev(), ErrNotFound)
	}
	for _, s := range files {
		if !validPath(s.Path) {
			return fmt.Errorf("repository %s: %w: bad file path %q", w.Repo, ErrProtocol, s.Path)
		}
		it := Item{Repo: w.Repo, Revision: w.rev(), Commit: info.Commit, Path: s.Path, Size: s.Size, LFS: s.LFS != nil}
		if s.LFS != nil {
			it.Size = s.LFS.Size
		}
		if p.Cache.linked(w.Repo, info.Commit, s.Path, it.Size) {
			it.Present = true
			plan.Items = append(plan.Items, it)
			continue
		}
		// Pinned to the commit, so that every file comes from the same one.
		var m FileMeta
		err := p.again(ctx, func() (err error) {
			m, err = p.Client.Head(ctx, w.Repo, info.Commit, s.Path)
			return err
		})
		if err != nil {
			return err
		}
		if m.Commit != info.Commit {
			return fmt.Errorf("%s in %s: %w: X-Repo-Commit %s, asked for %s", s.Path, w.Repo, ErrProtocol, m.Commit, info.Commit)
		}
		// The ETag names the blob (as huggingface_hub names it); for an LFS file it is the
		// sha256 the file list gives, which the contents are checked against.
		if s.LFS != nil && (m.Size != s.LFS.Size || (len(m.ETag) == 64 && m.ETag != s.LFS.SHA256) || len(s.LFS.SHA256) != 64 || !isHex(s.LFS.SHA256)) {
			return fmt.Errorf("%s in %s: %w: ETag %s size %d, the file list says sha256 %s size %d", s.Path, w.Repo, ErrProtocol, m.ETag, m.Size, s.LFS.SHA256, s.LFS.Size)
		}
		it.ETag, it.Size, it.Location = m.ETag, m.Size, m.Location
		switch {
		case s.LFS != nil:
			it.Hash = s.LFS.SHA256
		case len(s.BlobID) == 40 && isHex(s.BlobID):
			it.Hash = s.BlobID
		case hasherFor(m.ETag, m.Size) != nil:
			it.Hash = m.ETag
		}
		blob := p.Cache.BlobPath(w.Repo, m.ETag)
		if st, err := os.Stat(blob); err == nil && st.Size() == it.Size {
			it.BlobPresent = true
		} else if st, err := os.Stat(blob + ".incomplete"); err == nil && st.Size() <= it.Size {
			it.Have = st.Size()
		}
		plan.Items = append(plan.Items, it)
	}
	return nil
}

// again calls fn until it succeeds, fails for good (retryable) or has been retried Retries
// times, waiting Backoff between calls.
func (p *Puller) again(ctx context.Context, fn func() error) error {
	for attempt := 0; ; attempt++ {
		err := fn()
		if err == nil || !retryable(err) || attempt >= p.retries() {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(p.backoff(attempt)):
		}
	}
}

// validPath rejects paths that would leave the snapshot folder.
func validPath(p string) bool {
	if p == "" || strings.HasPrefix(p, "/") || strings.Contains(p, "\\") {
		return false
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return false
		}
	}
	return true
}

func (p *Puller) planOffline(plan *Plan, w Want) error {
	commit, ok := p.Cache.Snapshot(w.Repo, w.rev())
	if !ok {
		return fmt.Errorf("repository %s at %s: %w (cache %s)", w.Repo, w.rev(), ErrOffline, p.Cache.Root)
	}
	plan.Repos = append(plan.Repos, PlannedRepo{Repo: w.Repo, Revision: w.rev(), Commit: commit})
	snap := p.Cache.SnapshotDir(w.Repo, commit)
	matched := make([]bool, len(w.Include))
	err := filepath.WalkDir(snap, func(fp string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(snap, fp)
		rel = filepath.ToSlash(rel)
		i, ok := w.includes(rel)
		if !ok {
			return nil
		}
		st, err := os.Stat(fp)
		if err != nil {
			return fmt.Errorf("%s in %s: %w: its blob is missing", rel, w.Repo, ErrOffline)
		}
		if i >= 0 {
			matched[i] = true
		}
		plan.Items = append(plan.Items, Item{Repo: w.Repo, Revision: w.rev(), Commit: commit, Path: rel, Size: st.Size(), Present: true})
		return nil
	})
	if err != nil {
		return fmt.Errorf("repository %s: %w", w.Repo, err)
	}
	for i, m := range matched {
		if !m {
			return fmt.Errorf("repository %s at %s: %w: nothing matches %q in %s", w.Repo, commit, ErrOffline, w.Include[i], snap)
		}
	}
	return nil
}

// pullState is one Pull's progress bookkeeping.
type pullState struct {
	mu        sync.Mutex // mu protects the fields below and serialises Progress calls
	report    func(Progress)
	done      []int64
	totalDone int64
	filesDone int
	plan      *Plan
}

func (s *pullState) set(i int, state FileState, done int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.totalDone += done - s.done[i]
	s.done[i] = done
	if state == FileDone {
		s.filesDone++
	}
	if s.report == nil {
		return
	}
	it := &s.plan.Items[i] // fields set at planning only: fetch rewrites Location concurrently
	s.report(Progress{Repo: it.Repo, Path: it.Path, State: state, Err: err, Done: done, Size: it.Size,
		TotalDone: s.totalDone, Total: s.plan.Total, FilesDone: s.filesDone, Files: len(s.plan.Items)})
}

// Pull downloads what plan still needs, verifies every file and links it into its snapshot;
// when every file of a repository is there, refs/<revision> names its commit. It fails before
// downloading anything when the files do not fit the free disk space. A failed file leaves its
// partial blob for the next pull to resume and is never linked; the other files go on, and
// the error lists every failure.
func (p *Puller) Pull(ctx context.Context, plan *Plan) error {
	if plan.Need > 0 {
		if p.Offline {
			return fmt.Errorf("pull: %w", ErrOffline)
		}
		free := p.FreeSpace
		if free == nil {
			free = FreeSpace
		}
		avail, err := free(p.Cache.Root)
		if err != nil {
			return fmt.Errorf("pull: %w", err)
		}
		if uint64(plan.Need) > avail {
			return fmt.Errorf("pull: %w: %s to download, %s free in %s: free some space or pull into another folder (--cache)",
				ErrNoSpace, Bytes(plan.Need), Bytes(int64(avail)), p.Cache.Root)
		}
	}
	st := &pullState{report: p.Progress, done: make([]int64, len(plan.Items)), plan: plan}
	var todo []int
	for i, it := range plan.Items {
		switch {
		case it.Present:
			st.set(i, FileDone, it.Size, nil)
		case it.BlobPresent:
			if err := p.Cache.Link(it.Repo, it.Commit, it.Path, it.ETag); err != nil {
				return fmt.Errorf("pull %s: %w", it.Repo, err)
			}
			st.set(i, FileDone, it.Size, nil)
		default:
			st.set(i, FileQueued, it.Have, nil)
			todo = append(todo, i)
		}
	}
	// Largest first, so the long transfers overlap.
	sort.SliceStable(todo, func(a, b int) bool { return plan.Items[todo[a]].Size > plan.Items[todo[b]].Size })

	n := p.Concurrency
	if n <= 0 {
		n = 4
	}
	jobs := make(chan int)
	errs := make([]error, len(plan.Items))
	var wg sync.WaitGroup
	for range min(n, max(len(todo), 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := p.fetch(ctx, st, i); err != nil {
					errs[i] = err
					st.set(i, FileFailed, st.doneOf(i), err)
				}
			}
		}()
	}
feed:
	for _, i := range todo {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("pull: %w (what was downloaded is kept; run the pull again to resume)", context.Cause(ctx))
	}

	failedRepo := map[string]bool{}
	var all []error
	for i, err := range errs {
		if err != nil {
			failedRepo[plan.Items[i].Repo] = true
			all = append(all, err)
		}
	}
	for _, r := range plan.Repos {
		if failedRepo[r.Repo] {
			continue
		}
		if err := p.Cache.WriteRef(r.Repo, r.Revision, r.Commit); err != nil {
			all = append(all, err)
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("pull: %d of %d files failed: %w", len(all), len(plan.Items), errors.Join(all...))
	}
	return nil
}

func (s *pullState) doneOf(i int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done[i]
}

// retryable reports whether a failed transfer may succeed when tried again.
func retryable(err error) bool {
	var he *HTTPError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	case errors.As(err, &he):
		return he.Status >= 500 || he.Status == 429
	case errors.Is(err, ErrChecksum), errors.Is(err, ErrNoSpace), errors.Is(err, ErrProtocol):
		return false
	}
	return true
}

// fetch downloads item i, retrying transfer errors with a fresh location.
func (p *Puller) fetch(ctx context.Context, st *pullState, i int) error {
	it := &st.plan.Items[i]
	unlock, err := p.Cache.lock(ctx, it.Repo, it.ETag)
	if err != nil {
		return err
	}
	defer unlock()
	for attempt := 0; ; attempt++ {
		err := p.fetchOnce(ctx, st, i)
		if err == nil {
			return nil
		}
		if !retryable(err) || attempt >= p.retries() {
			return err
		}
		wait := p.backoff(attempt)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		// A redirect's signed URL may have expired: ask again.
		if m, herr := p.Client.Head(ctx, it.Repo, it.Commit, it.Path); herr == nil && m.ETag == it.ETag {
			it.Location = m.Location
		}
	}
}

func (p *Puller) retries() int {
	switch {
	case p.Retries < 0:
		return 0
	case p.Retries == 0:
		return 3
	}
	return p.Retries
}

func (p *Puller) backoff(n int) time.Duration {
	if p.Backoff != nil {
		return p.Backoff(n)
	}
	return min(time.Second<<n, 15*time.Second)
}

// fetchOnce makes one attempt: resume the partial blob, verify, rename, link.
func (p *Puller) fetchOnce(ctx context.Context, st *pullState, i int) (err error) {
	it := st.plan.Items[i]
	what := fmt.Sprintf("%s in %s", it.Path, it.Repo)
	blob := p.Cache.BlobPath(it.Repo, it.ETag)
	if fi, err := os.Stat(blob); err == nil && fi.Size() == it.Size {
		// Another process finished it while we waited for the lock.
		if err := p.Cache.Link(it.Repo, it.Commit, it.Path, it.ETag); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		st.set(i, FileDone, it.Size, nil)
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return fmt.Errorf("%s: %w", what, diskErr(err))
	}
	inc := blob + ".incomplete"
	f, err := os.OpenFile(inc, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("%s: %w", what, diskErr(err))
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("%s: %w", what, diskErr(cerr))
		}
	}()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	have := fi.Size()
	if have > it.Size {
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("%s: %w", what, diskErr(err))
		}
		have = 0
	}
	h := hasherFor(it.Hash, it.Size)
	if it.LFS && h == nil {
		return fmt.Errorf("%s: %w: cannot verify sha256 %q", what, ErrProtocol, it.Hash)
	}
	if h == nil {
		h = nopHash{}
	}
	// The partial part counts towards the hash: read it back once.
	if have > 0 {
		st.set(i, FileVerifying, have, nil)
		if _, err := io.Copy(h, &ctxReader{ctx: ctx, r: io.NewSectionReader(f, 0, have)}); err != nil {
			return fmt.Errorf("%s: read partial blob: %w", what, err)
		}
	}
	if have < it.Size {
		// A transfer that stalls is abandoned after StallTimeout (and retried, resuming).
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stall := time.AfterFunc(p.stallTimeout(), func() { cancel(errStalled) })
		defer stall.Stop()
		body, start, err := p.Client.Open(ctx, it.Repo, it.Path, it.Location, have)
		if errors.Is(err, errRangeNotSatisfiable) {
			body, start, err = p.Client.Open(ctx, it.Repo, it.Path, it.Location, 0)
		}
		if err != nil {
			if errors.Is(context.Cause(ctx), errStalled) {
				return fmt.Errorf("%s: %w: %w for %v", what, ErrTruncated, errStalled, p.stallTimeout())
			}
			return err
		}
		defer body.Close()
		if start != have {
			// The server sent the whole file: start over.
			if err := f.Truncate(0); err != nil {
				return fmt.Errorf("%s: %w", what, diskErr(err))
			}
			have = 0
			h = hasherFor(it.Hash, it.Size)
			if h == nil {
				h = nopHash{}
			}
		}
		if _, err := f.Seek(have, io.SeekStart); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		st.set(i, FileDownloading, have, nil)
		w := &progressWriter{w: io.MultiWriter(f, h), n: have, report: func(n int64) {
			stall.Reset(p.stallTimeout())
			st.set(i, FileDownloading, n, nil)
		}}
		n, cerr := io.Copy(w, io.LimitReader(body, it.Size-have+1))
		got := have + n
		if errors.Is(context.Cause(ctx), errStalled) {
			cerr = fmt.Errorf("%w for %v", errStalled, p.stallTimeout())
		}
		if cerr != nil && isDiskErr(cerr) {
			return fmt.Errorf("%s: %w", what, diskErr(cerr))
		}
		if got < it.Size {
			if cerr == nil {
				cerr = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("%s: %w at %s of %s (kept for resuming): %v", what, ErrTruncated, Bytes(got), Bytes(it.Size), cerr)
		}
		if got > it.Size {
			_ = os.Remove(inc)
			return fmt.Errorf("%s: %w: the server sent more than %d bytes", what, ErrChecksum, it.Size)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("%s: %w", what, diskErr(err))
		}
	}
	st.set(i, FileVerifying, it.Size, nil)
	if _, unverifiable := h.(nopHash); !unverifiable {
		if got := hex.EncodeToString(h.Sum(nil)); got != it.Hash {
			// Every byte is there and wrong: resuming cannot mend it, so it goes.
			_ = os.Remove(inc)
			return fmt.Errorf("%s: %w: got %s, want %s (not linked; the next pull downloads it again)", what, ErrChecksum, got, it.Hash)
		}
	}
	if err := os.Rename(inc, blob); err != nil {
		return fmt.Errorf("%s: %w", what, diskErr(err))
	}
	if err := p.Cache.Link(it.Repo, it.Commit, it.Path, it.ETag); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	st.set(i, FileDone, it.Size, nil)
	return nil
}

// nopHash stands in for a file whose ETag names no hash we know: only its size is checked.
type nopHash struct{}

func (nopHash) Write(p []byte) (int, error) { return len(p), nil }
func (nopHash) Sum(b []byte) []byte         { return b }
func (nopHash) Reset()                      {}
func (nopHash) Size() int                   { return 0 }
func (nopHash) BlockSize() int              { return 1 }

var _ hash.Hash = nopHash{}

// progressWriter counts bytes written and reports the running total.
type progressWriter struct {
	w      io.Writer
	n      int64
	report func(int64)
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.n += int64(n)
	if n > 0 {
		p.report(p.n)
	}
	return n, err
}

func isDiskErr(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// diskErr marks a full disk as ErrNoSpace.
func diskErr(err error) error {
	if isDiskErr(err) {
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	}
	return err
}

// Bytes formats a byte count for people (1.5 GiB).
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if f < unit || u == "TiB" {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return ""
}
