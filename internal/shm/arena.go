// Package shm holds the tensors that pass between framepackd processes: safetensors files in
// /dev/shm/framepackd-<uid>/daemon-<pid>-<random>/<job>/ (0700 directories, 0600 files) whose
// header is padded so the tensor data starts on a 4096-byte boundary.
//
// Every daemon owns its own folder under the user's root (OpenInstance), locked for the
// daemon's life: a daemon that starts removes only folders whose owner is dead, one that stops
// removes only its own, and one whose folder vanished makes it again (Instance.Check). The
// supervisor owns the names: it makes one Arena per job and reserves a path with Arena.NewSegment for every
// tensor file a stage will produce or consume. Whoever fills a segment writes "<path>.partial"
// and renames it to path when complete (Create/Writer.Commit or WriteSegment); readers map
// complete segments read-only with Open. Closing the arena removes the job's directory.
package shm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Typed errors that callers act on.
var (
	// ErrInvalidName is returned for a job or segment name that is not a plain file name.
	ErrInvalidName = errors.New("shm: invalid name")
	// ErrExists is returned when a job arena or segment name is already taken.
	ErrExists = errors.New("shm: name already in use")
	// ErrClosed is returned by an Arena after Close.
	ErrClosed = errors.New("shm: arena closed")
	// ErrUnsafeRoot is returned when the root directory is not a private directory of this user.
	ErrUnsafeRoot = errors.New("shm: root is not a private directory of this user")
)

// SegmentExt is the extension of a complete segment file.
const SegmentExt = ".safetensors"

// PartialExt is appended to a segment's path while it is being written.
const PartialExt = ".partial"

// OwnerFile is the file in each job directory that names and locks its owner.
const OwnerFile = ".owner"

// orphanGrace is how old a job directory without an owner file must be before RemoveStale
// removes it (a younger one may be an arena that is being created right now).
const orphanGrace = 30 * time.Second

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func checkName(kind, name string) error {
	if !nameRE.MatchString(name) || strings.Contains(name, "..") || strings.HasSuffix(name, PartialExt) {
		return fmt.Errorf("%w: %s %q (letters, digits, '.', '_', '-'; at most 128)", ErrInvalidName, kind, name)
	}
	return nil
}

// DefaultRoot returns the per-user root, /dev/shm/framepackd-<uid>.
func DefaultRoot() string {
	return filepath.Join("/dev/shm", "framepackd-"+strconv.Itoa(os.Getuid()))
}

// Root is the directory that holds one arena directory per job. It is safe for concurrent use.
type Root struct {
	dir string
	// ensure, when set, makes dir again after it was removed under the process (an
	// Instance's folder); nil for a plain root.
	ensure func() error
}

// OpenRoot creates dir (mode 0700) if needed and checks that it is a real directory owned by
// this user and closed to others; a root that fails the check is not used (ErrUnsafeRoot).
func OpenRoot(dir string) (*Root, error) {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("open shm root %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return nil, fmt.Errorf("open shm root %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, fmt.Errorf("open shm root %s: %w: not a directory", dir, ErrUnsafeRoot)
	}
	if int(st.Uid) != os.Getuid() {
		return nil, fmt.Errorf("open shm root %s: %w: owned by uid %d", dir, ErrUnsafeRoot, st.Uid)
	}
	if st.Mode&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("open shm root %s: %w", dir, err)
		}
	}
	return &Root{dir: dir}, nil
}

// Dir returns the root directory.
func (r *Root) Dir() string { return r.dir }

// RemoveStale removes the job directories whose owner is gone: the owner's lock on the owner
// file is free (the kernel drops it when the owning process dies, whatever its pid became), or
// there is no owner file and the directory is older than a short grace period. It returns the
// directories it removed and keeps going past errors, which it joins.
func (r *Root) RemoveStale() ([]string, error) {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil, fmt.Errorf("remove stale arenas: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(r.dir, e.Name())
		stale, err := r.removeIfStale(dir)
		if err != nil {
			errs = append(errs, err)
		}
		if stale {
			removed = append(removed, dir)
		}
	}
	return removed, errors.Join(errs...)
}

func (r *Root) removeIfStale(dir string) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, OwnerFile), os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		st, err := os.Lstat(dir)
		if err != nil || time.Since(st.ModTime()) < orphanGrace {
			return false, nil
		}
		if err := os.RemoveAll(dir); err != nil {
			return false, fmt.Errorf("remove stale arena %s: %w", dir, err)
		}
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("check arena %s: %w", dir, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return false, nil // owner alive
		}
		return false, fmt.Errorf("check arena %s: lock: %w", dir, err)
	}
	// An owner writes its pid only after it holds the lock: an empty owner file in a young
	// directory is an owner between creating the file and locking it.
	if st, err := f.Stat(); err == nil && st.Size() == 0 && time.Since(st.ModTime()) < orphanGrace {
		return false, nil
	}
	// We hold the lock now, so no live owner can appear until the directory is gone.
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("remove stale arena %s: %w", dir, err)
	}
	return true, nil
}

// RemoveIfEmpty removes the root directory if it holds nothing (no arena is open). It is what a
// supervisor calls on a clean shutdown.
func (r *Root) RemoveIfEmpty() error {
	err := os.Remove(r.dir)
	if err == nil || errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("remove shm root: %w", err)
}

// Arena is one job's directory of segments. The process that creates it owns it: it holds a lock
// on the owner file for the arena's life, so other supervisors' RemoveStale leave it alone. Its
// methods are safe for concurrent use.
type Arena struct {
	job   string
	dir   string
	owner *os.File // locked owner file; kept open for the arena's life

	mu       sync.Mutex          // mu protects segments and closed
	segments map[string]struct{} // reserved segment names
	closed   bool
}

// NewArena creates the directory of job (mode 0700) with a locked owner file that records this
// process's pid. A job name already in use by a live arena is ErrExists.
func (r *Root) NewArena(job string) (*Arena, error) {
	if err := checkName("job", job); err != nil {
		return nil, err
	}
	dir := filepath.Join(r.dir, job)
	err := os.Mkdir(dir, 0o700)
	if errors.Is(err, fs.ErrNotExist) && r.ensure != nil {
		// The root itself is gone (removed under us): make it again, then the arena.
		if eerr := r.ensure(); eerr != nil {
			return nil, fmt.Errorf("new arena %s: %w", job, eerr)
		}
		err = os.Mkdir(dir, 0o700)
	}
	if err != nil {
		if !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("new arena %s: %w", job, err)
		}
		// Left over from a dead owner? Then it goes; a live owner keeps it.
		stale, serr := r.removeIfStale(dir)
		if serr != nil {
			return nil, fmt.Errorf("new arena %s: %w", job, serr)
		}
		if !stale {
			return nil, fmt.Errorf("new arena %s: %w", job, ErrExists)
		}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return nil, fmt.Errorf("new arena %s: %w", job, err)
		}
	}
	owner, err := os.OpenFile(filepath.Join(dir, OwnerFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("new arena %s: owner file: %w", job, err)
	}
	// Blocking: another supervisor's RemoveStale holds the lock only while it checks the file.
	if err := unix.Flock(int(owner.Fd()), unix.LOCK_EX); err != nil {
		owner.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("new arena %s: lock owner file: %w", job, err)
	}
	if _, err := owner.WriteString(strconv.Itoa(os.Getpid()) + "\n"); err != nil {
		owner.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("new arena %s: owner file: %w", job, err)
	}
	return &Arena{job: job, dir: dir, owner: owner, segments: map[string]struct{}{}}, nil
}

// Job returns the arena's job name.
func (a *Arena) Job() string { return a.job }

// Dir returns the arena's directory.
func (a *Arena) Dir() string { return a.dir }

// NewSegment reserves name in the arena and returns the path of its segment file,
// "<dir>/<name>.safetensors". Nothing is created: the writer creates the file.
func (a *Arena) NewSegment(name string) (string, error) {
	if err := checkName("segment", name); err != nil {
		return "", err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return "", ErrClosed
	}
	if _, ok := a.segments[name]; ok {
		return "", fmt.Errorf("new segment %s: %w", name, ErrExists)
	}
	a.segments[name] = struct{}{}
	return a.path(name), nil
}

func (a *Arena) path(name string) string { return filepath.Join(a.dir, name+SegmentExt) }

// Segments returns the reserved segment names, sorted.
func (a *Arena) Segments() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.segments))
	for n := range a.segments {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Remove deletes the segment's file (complete or partial) and releases its name. Processes that
// still map the file keep their mapping; the memory is freed when the last one unmaps it.
func (a *Arena) Remove(name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}
	if _, ok := a.segments[name]; !ok {
		return fmt.Errorf("remove segment %q: %w", name, fs.ErrNotExist)
	}
	delete(a.segments, name)
	p := a.path(name)
	var errs []error
	for _, f := range []string{p, p + PartialExt} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove segment %s: %w", name, err)
	}
	return nil
}

// Close removes the arena's directory with every file in it and releases the owner lock. Later
// calls do nothing.
func (a *Arena) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil
	}
	a.closed = true
	a.segments = nil
	err := os.RemoveAll(a.dir)
	a.owner.Close() // closing drops the lock
	if err != nil {
		return fmt.Errorf("close arena %s: %w", a.job, err)
	}
	return nil
}
