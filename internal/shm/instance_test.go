package shm_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
)

// TestInstancesShareRoot: two daemons of one user under one root each get their own folder;
// closing one leaves the other's folder, its arenas and the root; a third daemon's start
// removes only the folder of a dead owner.
func TestInstancesShareRoot(t *testing.T) {
	base := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(base) })
	a, _, err := shm.OpenInstance(base)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := shm.OpenInstance(base)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.Dir() == b.Dir() || filepath.Dir(a.Dir()) != base || filepath.Dir(b.Dir()) != base {
		t.Fatalf("folders %s and %s under %s", a.Dir(), b.Dir(), base)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("closed daemon's folder kept: %v", err)
	}
	arena, err := b.Root().NewArena("job1")
	if err != nil {
		t.Fatalf("the other daemon's arena after one stopped: %v", err)
	}
	if err := arena.Close(); err != nil {
		t.Fatal(err)
	}

	// A folder whose owner died (its lock is free, its owner file names a pid) goes at the
	// next daemon's start; the live one stays.
	dead := filepath.Join(base, shm.InstancePrefix+"1-dead")
	if err := os.MkdirAll(filepath.Join(dead, "job"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dead, shm.OwnerFile), []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, removed, err := shm.OpenInstance(base)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !slices.Equal(removed, []string{dead}) {
		t.Fatalf("removed %v, want only %s", removed, dead)
	}
	if _, err := os.Stat(b.Dir()); err != nil {
		t.Fatalf("live daemon's folder removed: %v", err)
	}
}

// TestInstanceRecreatesLostFolder: a daemon whose folder was removed under it (the whole root,
// as an old daemon's shutdown did) makes it again on its next arena and on Check.
func TestInstanceRecreatesLostFolder(t *testing.T) {
	base := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(base) })
	in, _, err := shm.OpenInstance(base)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.RemoveAll(base); err != nil {
		t.Fatal(err)
	}
	a, err := in.Root().NewArena("after-loss")
	if err != nil {
		t.Fatalf("arena after the folder was removed: %v", err)
	}
	defer a.Close()
	if err := os.RemoveAll(in.Dir()); err != nil {
		t.Fatal(err)
	}
	if err := in.Check(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(in.Dir(), shm.OwnerFile)); err != nil {
		t.Fatalf("owner file after Check: %v", err)
	}
	// The recreated folder is locked again: another daemon's sweep keeps it.
	other, removed, err := shm.OpenInstance(base)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if slices.Contains(removed, in.Dir()) {
		t.Fatalf("live recreated folder swept: %v", removed)
	}
	// A root that cannot be made again is reported.
	if err := os.RemoveAll(base); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(base)
	if err := in.Check(); err == nil {
		t.Fatal("Check of a folder that cannot be made: no error")
	}
}
