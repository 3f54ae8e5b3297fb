package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// InstancePrefix starts the name of every daemon's own folder under a shared root:
// <root>/daemon-<pid>-<random>/.
const InstancePrefix = "daemon-"

// Instance is one daemon's own folder under a root that several daemons of one user share
// (/dev/shm/framepackd-<uid>/daemon-<pid>-<random>). The daemon holds a lock on the folder's
// owner file for its whole life, so other daemons' RemoveStale leave the folder alone while it
// lives and remove it once it is dead. Its job arenas live inside it (Root). Methods are safe
// for concurrent use.
type Instance struct {
	base *Root
	root *Root

	mu    sync.Mutex // mu protects owner and ino
	owner *os.File   // locked owner file of the folder
	ino   uint64     // inode of owner, to see whether the folder is still ours
}

// OpenInstance opens base (as OpenRoot), removes the folders and job directories of dead
// owners in it, and creates this process's own folder, locked for the process's life.
func OpenInstance(base string) (*Instance, []string, error) {
	b, err := OpenRoot(base)
	if err != nil {
		return nil, nil, err
	}
	removed, staleErr := b.RemoveStale()
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := InstancePrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:])
	in := &Instance{base: b, root: &Root{dir: filepath.Join(base, name)}}
	in.root.ensure = in.ensure
	in.mu.Lock()
	err = in.createLocked()
	in.mu.Unlock()
	if err != nil {
		return nil, removed, err
	}
	return in, removed, staleErr
}

// Root returns the root the daemon's job arenas are made in (its own folder).
func (in *Instance) Root() *Root { return in.root }

// Dir returns the daemon's own folder.
func (in *Instance) Dir() string { return in.root.dir }

// createLocked makes the folder and its locked owner file; the caller holds mu.
func (in *Instance) createLocked() error {
	dir := in.root.dir
	if err := os.MkdirAll(in.base.dir, 0o700); err != nil {
		return fmt.Errorf("create shm folder %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create shm folder %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, OwnerFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("create shm folder %s: owner file: %w", dir, err)
	}
	// Blocking: a sweeping daemon holds the lock only for the moment it checks the file.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return fmt.Errorf("create shm folder %s: lock owner file: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("create shm folder %s: owner file: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return fmt.Errorf("create shm folder %s: %w", dir, err)
	}
	if in.owner != nil {
		in.owner.Close()
	}
	in.owner, in.ino = f, st.Ino
	return nil
}

// Check reports whether the folder is still this daemon's (its owner file is the one this
// process locked). A folder that is gone (removed by hand, by a tmp cleaner, or by an older
// daemon's shutdown) is created again; the error says why when that fails too.
func (in *Instance) Check() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.owner == nil {
		return ErrClosed
	}
	if in.intactLocked() {
		return nil
	}
	if err := in.createLocked(); err != nil {
		return fmt.Errorf("shared-memory folder %s was removed and cannot be made again: %w", in.root.dir, err)
	}
	return nil
}

// ensure is Root.ensure for the instance's root: it recreates a lost folder.
func (in *Instance) ensure() error { return in.Check() }

func (in *Instance) intactLocked() bool {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(in.root.dir, OwnerFile), &st); err != nil {
		return false
	}
	return st.Ino == in.ino
}

// Close removes the daemon's folder with everything in it and releases its lock. The shared
// root stays: other daemons may be using it.
func (in *Instance) Close() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.owner == nil {
		return nil
	}
	var err error
	if in.intactLocked() {
		err = os.RemoveAll(in.root.dir)
	}
	in.owner.Close()
	in.owner = nil
	if err != nil {
		return fmt.Errorf("remove shm folder %s: %w", in.root.dir, err)
	}
	return nil
}
