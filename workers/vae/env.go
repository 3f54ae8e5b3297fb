package main

import (
	"fmt"
	"os"
	"path/filepath"
)

// envCudnnFindDB names the cuDNN find database the cuda backend reads and appends to
// (native/gpu/fpk_gpu_vendor.cu): the algorithms FindEx chose, so a later worker skips Find.
const envCudnnFindDB = "FRAMEPACK_CUDNN_FIND_DB"

// cudnnFindDBSuffix is appended to the conv decision cache's path for the default find database.
const cudnnFindDBSuffix = ".cudnn-find"

// findDB returns the cuDNN find database the cuda backend is to keep its Find results in:
// the one env names, else decisionCache + ".cudnn-find" (beside the conv decision cache, shared
// by the workers as the cache is); "" on other backends or without a decision cache.
func findDB(backend, decisionCache string, env map[string]string) (string, error) {
	if backend != "cuda" {
		return "", nil
	}
	if p, ok := env[envCudnnFindDB]; ok {
		if !filepath.IsAbs(p) {
			return "", fmt.Errorf("env %s=%q: want an absolute path", envCudnnFindDB, p)
		}
		return p, nil
	}
	if decisionCache == "" {
		return "", nil
	}
	return decisionCache + cudnnFindDBSuffix, nil
}

// applyFindDB sets the find database findDB names in the process environment.
func applyFindDB(backend, decisionCache string, env map[string]string) (string, error) {
	p, err := findDB(backend, decisionCache, env)
	if err != nil || p == "" {
		return "", err
	}
	if err := os.Setenv(envCudnnFindDB, p); err != nil {
		return "", fmt.Errorf("env %s: %w", envCudnnFindDB, err)
	}
	return p, nil
}
