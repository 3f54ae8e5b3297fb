package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// MIOpen variables the supervisor may send (ARCHITECTURE §5); only real MIOpen variables.
const (
	envFindMode       = "MIOPEN_FIND_MODE"
	envFindEnforce    = "MIOPEN_FIND_ENFORCE"
	envImmedFallback  = "MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK"
	envUserDBPath     = "MIOPEN_USER_DB_PATH"
	envCustomCacheDir = "MIOPEN_CUSTOM_CACHE_DIR"
	// envFindTimeLimit does not exist in MIOpen (Find has no time limit); it is dropped so
	// nobody believes it bounds anything.
	envFindTimeLimit = "MIOPEN_FIND_TIME_LIMIT"
)

// envCudnnFindDB names the cuDNN find database the cuda backend reads and appends to
// (native/gpu/fpk_gpu_vendor.cu): the algorithms FindEx chose, so a later worker skips Find.
const envCudnnFindDB = "FRAMEPACK_CUDNN_FIND_DB"

// cudnnFindDBSuffix is appended to the conv decision cache's path for the default find database.
const cudnnFindDBSuffix = ".cudnn-find"

// findModes maps MIOPEN_FIND_MODE's accepted spellings to MIOpen's numbers.
var findModes = map[string]int{
	"1": 1, "NORMAL": 1,
	"2": 2, "FAST": 2,
	"3": 3, "HYBRID": 3,
	"4": 4, "FAST_HYBRID": 4,
	"5": 5, "DYNAMIC_HYBRID": 5,
}

// envPlan is what the worker does with a LoadRequest's env.
type envPlan struct {
	// Apply is set in the process environment before the backend opens.
	Apply map[string]string
	// Ignored are variables recorded but not set (MIOpen settings on a backend without
	// MIOpen), by name.
	Ignored map[string]string
	// Dropped explains variables refused without failing the load, by name.
	Dropped map[string]string
	// Dirs are directories to create before the backend opens (MIOpen's databases).
	Dirs []string
}

// planEnv validates env for backend ("cpu", "hip", "cuda"). MIOpen settings are applied only
// on hip; elsewhere they are recorded and ignored. Bad values fail the load: the supervisor
// sent something MIOpen would misread.
func planEnv(backend string, env map[string]string) (envPlan, error) {
	p := envPlan{Apply: map[string]string{}, Ignored: map[string]string{}, Dropped: map[string]string{}}
	fast := false
	if v, ok := env[envFindMode]; ok {
		mode, ok := findModes[strings.ToUpper(strings.TrimSpace(v))]
		if !ok {
			return envPlan{}, fmt.Errorf("env %s=%q: not a find mode (1 NORMAL, 2 FAST, 3 HYBRID, 5 DYNAMIC_HYBRID)", envFindMode, v)
		}
		fast = mode == 2
	}
	miopen := backend == "hip"
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := env[k]
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return envPlan{}, fmt.Errorf("env %q: not a valid variable", k)
		}
		switch k {
		case envFindTimeLimit:
			p.Dropped[k] = "MIOpen has no such variable (Find cannot be time-limited)"
			continue
		case envFindEnforce:
			if fast {
				p.Dropped[k] = "ignored with MIOPEN_FIND_MODE=FAST (it would force NORMAL)"
				continue
			}
		case envImmedFallback:
			if v != "0" && v != "1" {
				return envPlan{}, fmt.Errorf("env %s=%q: want 0 or 1", k, v)
			}
		case envUserDBPath, envCustomCacheDir, envCudnnFindDB:
			if !filepath.IsAbs(v) {
				return envPlan{}, fmt.Errorf("env %s=%q: want an absolute path", k, v)
			}
			if miopen {
				p.Dirs = append(p.Dirs, v)
			}
		}
		if strings.HasPrefix(k, "MIOPEN_") && !miopen {
			p.Ignored[k] = v
			continue
		}
		p.Apply[k] = v
	}
	return p, nil
}

// withFindDB makes the cuda backend keep its cuDNN Find results beside the conv decision cache
// (decisionCache + ".cudnn-find", shared by the workers as the cache is) unless the request
// names a find database itself or there is no decision cache.
func (p envPlan) withFindDB(backend, decisionCache string) envPlan {
	if backend != "cuda" || decisionCache == "" {
		return p
	}
	if _, ok := p.Apply[envCudnnFindDB]; !ok {
		p.Apply[envCudnnFindDB] = decisionCache + cudnnFindDBSuffix
	}
	return p
}

// apply creates the directories and sets the variables.
func (p envPlan) apply() error {
	for _, d := range p.Dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("env: %w", err)
		}
	}
	for k, v := range p.Apply {
		if err := os.Setenv(k, v); err != nil {
			return fmt.Errorf("env %s: %w", k, err)
		}
	}
	return nil
}
