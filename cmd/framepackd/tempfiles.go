package main

// Temporary files: the daemon gives itself (and, through TMPDIR, its workers and go-plugin's
// socket folders) a private temporary folder, removed on exit; at start it removes the
// folders of dead daemons and the leftovers older versions scattered in the temporary
// directory.

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/shm"
)

// legacyTempPatterns are what workers and tests left directly in the temporary directory
// before each daemon had its own folder: go-plugin's socket folders, GPU scratch files, the
// watchdog tests' socket folders.
var legacyTempPatterns = []string{"plugin-dir*", "fpk_gpu_*", "fpws*"}

// legacyTempAge is how old a legacy leftover must be before the sweep removes it (a younger
// one may belong to a process running now).
const legacyTempAge = time.Hour

// openTemp makes this daemon's private temporary folder under $TMPDIR/framepackd-<uid>
// (locked like its shared-memory folder, so a starting daemon removes only dead daemons'),
// sweeps old legacy leftovers, and points TMPDIR at the folder for this process and the
// workers it starts. Its Close removes the folder and gives TMPDIR its old value back.
func openTemp(log logrus.FieldLogger) (*tempFolder, error) {
	prev, had := os.LookupEnv("TMPDIR")
	tmp := os.TempDir()
	sweepLegacyTemp(tmp, time.Now(), log)
	inst, removed, err := shm.OpenInstance(filepath.Join(tmp, "framepackd-"+strconv.Itoa(os.Getuid())))
	if len(removed) > 0 {
		log.WithField("removed", removed).Info("removed temporary folders of stopped daemons")
	}
	if inst == nil {
		return nil, err
	}
	if err != nil {
		log.WithError(err).Warn("remove temporary folders of stopped daemons")
	}
	// go-plugin puts each worker's socket two levels below (plugin-dirN/pluginN, ~40 bytes)
	// and a unix socket path holds at most 107: keep TMPDIR when ours would be too long.
	if len(inst.Dir()) > 60 {
		log.WithField("dir", inst.Dir()).Warn("temporary folder path too long for worker sockets; workers use $TMPDIR itself")
		return &tempFolder{inst, prev, had}, nil
	}
	if err := os.Setenv("TMPDIR", inst.Dir()); err != nil {
		inst.Close()
		return nil, err
	}
	return &tempFolder{inst, prev, had}, nil
}

// tempFolder is the daemon's private temporary folder and the TMPDIR it replaced.
type tempFolder struct {
	*shm.Instance
	prevTmp string
	hadTmp  bool
}

// Close removes the folder and gives TMPDIR back, since it named the folder just removed
// (run is also called in-process, by tests, and the process goes on).
func (t *tempFolder) Close() error {
	err := t.Instance.Close()
	if t.hadTmp {
		_ = os.Setenv("TMPDIR", t.prevTmp)
	} else {
		_ = os.Unsetenv("TMPDIR")
	}
	return err
}

// sweepLegacyTemp removes this user's legacy leftovers in dir older than legacyTempAge.
func sweepLegacyTemp(dir string, now time.Time, log logrus.FieldLogger) {
	var removed []string
	for _, pat := range legacyTempPatterns {
		matches, _ := filepath.Glob(filepath.Join(dir, pat))
		for _, p := range matches {
			st, err := os.Lstat(p)
			if err != nil || now.Sub(st.ModTime()) < legacyTempAge {
				continue
			}
			if sys, ok := st.Sys().(*syscall.Stat_t); !ok || int(sys.Uid) != os.Getuid() {
				continue
			}
			if err := os.RemoveAll(p); err != nil {
				log.WithError(err).WithField("path", p).Debug("remove legacy temporary file")
				continue
			}
			removed = append(removed, p)
		}
	}
	if len(removed) > 0 {
		log.WithField("removed", removed).Info("removed old temporary files")
	}
}
