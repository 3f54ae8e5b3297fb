package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Checkpoint is a set of safetensors files seen as one: a single file, or the shards named by a
// `*.safetensors.index.json` weight map (the Hugging Face sharded layout).
type Checkpoint struct {
	Path   string           // the file or index the checkpoint was opened from
	files  []*File          // every opened shard
	byName map[string]*File // tensor name → shard
}

type indexFile struct {
	WeightMap map[string]string `json:"weight_map"`
}

// OpenCheckpoint opens path: a .safetensors file, an .index.json, or a model folder. In a folder it
// uses the one index file if present, otherwise the one .safetensors file; anything ambiguous or
// missing is an error that says what was found.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	if st.IsDir() {
		path, err = findCheckpointFile(path)
		if err != nil {
			return nil, err
		}
	}
	if strings.HasSuffix(path, ".index.json") {
		return openSharded(path)
	}
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Path: path, files: []*File{f}, byName: map[string]*File{}}
	for _, t := range f.header.Tensors {
		c.byName[t.Name] = f
	}
	return c, nil
}

func findCheckpointFile(dir string) (string, error) {
	idx, _ := filepath.Glob(filepath.Join(dir, "*.safetensors.index.json"))
	if len(idx) == 1 {
		return idx[0], nil
	}
	if len(idx) > 1 {
		return "", fmt.Errorf("open checkpoint %s: several index files: %s", dir, strings.Join(idx, ", "))
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	switch len(files) {
	case 1:
		return files[0], nil
	case 0:
		return "", fmt.Errorf("open checkpoint %s: no .safetensors file or index", dir)
	}
	return "", fmt.Errorf("open checkpoint %s: several .safetensors files and no index: %s", dir, strings.Join(files, ", "))
}

func openSharded(indexPath string) (_ *Checkpoint, err error) {
	raw, err := os.ReadFile(indexPath)
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	var idx indexFile
	if err := json.Unmarshal(raw, &idx); err != nil {
		return nil, fmt.Errorf("%s: %w: index is not JSON: %v", indexPath, ErrInvalid, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: %w: empty weight_map", indexPath, ErrInvalid)
	}
	c := &Checkpoint{Path: indexPath, byName: map[string]*File{}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	dir := filepath.Dir(indexPath)
	shards := map[string]*File{}
	names := make([]string, 0, len(idx.WeightMap))
	for name := range idx.WeightMap {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		shard := idx.WeightMap[name]
		if shard == "" || filepath.Base(shard) != shard {
			return nil, fmt.Errorf("%s: %w: tensor %q maps to bad shard name %q", indexPath, ErrInvalid, name, shard)
		}
		f, ok := shards[shard]
		if !ok {
			f, err = Open(filepath.Join(dir, shard))
			if err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return nil, fmt.Errorf("%s: shard %s (holding %q) is missing: %w", indexPath, shard, name, err)
				}
				return nil, err
			}
			shards[shard] = f
			c.files = append(c.files, f)
		}
		if _, ok := f.Info(name); !ok {
			return nil, fmt.Errorf("%s: %w: tensor %q not found in shard %s", indexPath, ErrInvalid, name, shard)
		}
		c.byName[name] = f
	}
	return c, nil
}

// Names returns every tensor name, sorted.
func (c *Checkpoint) Names() []string {
	out := make([]string, 0, len(c.byName))
	for n := range c.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Info describes tensor name.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	f, ok := c.byName[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.Info(name)
}

// File returns the shard holding tensor name.
func (c *Checkpoint) File(name string) (*File, bool) {
	f, ok := c.byName[name]
	return f, ok
}

// Bytes returns the raw data of tensor name.
func (c *Checkpoint) Bytes(name string) ([]byte, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", c.Path, name)
	}
	return f.Bytes(name)
}

// Release drops tensor name's pages from the process's resident memory (File.Release).
func (c *Checkpoint) Release(name string) {
	if f, ok := c.byName[name]; ok {
		f.Release(name)
	}
}

// Float32 returns tensor name converted to float32 and its shape.
func (c *Checkpoint) Float32(name string) ([]float32, []int64, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, nil, fmt.Errorf("%s: no tensor %q", c.Path, name)
	}
	return f.Float32(name)
}

// Close unmaps every shard.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}
