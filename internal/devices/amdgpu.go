package devices

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// amdgpu sysfs, as the kernel lays it out:
//
//	/sys/class/kfd/kfd/topology/nodes/<n>/properties   "key value" lines: simd_count,
//	    cpu_cores_count, gfx_target_version (major·10000 + minor·100 + stepping), domain,
//	    location_id (bus<<8 | device<<3 | function), vendor_id, device_id
//	/sys/bus/pci/devices/<domain:bus:dev.fn>/           vendor (0x1002), device, product_name,
//	    mem_info_vram_total, mem_info_vram_used, mem_info_gtt_total, mem_info_gtt_used (bytes)
//
// GPU nodes of the kfd topology, in node order, are HIP's device order; a node is matched to
// its PCI device by bus id (domain and location_id), never by position.
const (
	kfdNodes   = "sys/class/kfd/kfd/topology/nodes"
	pciDevices = "sys/bus/pci/devices"
	amdVendor  = 0x1002
	// unifiedVRAM is the most VRAM an APU's carve-out is taken to have when deciding that its
	// memory is unified (GTT larger than VRAM below this size).
	unifiedVRAM = 1 << 30
)

func sysPath(root string, parts ...string) string {
	if root == "" {
		root = "/"
	}
	return filepath.Join(append([]string{root}, parts...)...)
}

// kfdNode is a GPU node of the kfd topology.
type kfdNode struct {
	id         int
	props      map[string]uint64
	busID      string
	arch       string
	cpuCores   uint64
	simd       uint64
	deviceID   uint64
	targetVers uint64
}

func readProps(path string) (map[string]uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	props := map[string]uint64{}
	for _, line := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		props[k] = n
	}
	return props, nil
}

// gfxArch names a gfx_target_version: 100300 → gfx1030, 90010 → gfx90a, 110501 → gfx1151.
func gfxArch(v uint64) string {
	if v == 0 {
		return ""
	}
	return fmt.Sprintf("gfx%d%x%x", v/10000, (v/100)%100, v%100)
}

// busIDOf formats a kfd node's PCI address.
func busIDOf(domain, loc uint64) string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, loc>>8&0xff, loc>>3&0x1f, loc&7)
}

// kfdGPUs returns the GPU nodes of the kfd topology in node order.
func kfdGPUs(root string) ([]kfdNode, error) {
	dir := sysPath(root, kfdNodes)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var nodes []kfdNode
	for _, e := range ents {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		props, err := readProps(filepath.Join(dir, e.Name(), "properties"))
		if err != nil {
			return nil, fmt.Errorf("kfd node %d: %w", id, err)
		}
		if props["simd_count"] == 0 {
			continue // a CPU node
		}
		nodes = append(nodes, kfdNode{
			id: id, props: props,
			busID:      busIDOf(props["domain"], props["location_id"]),
			targetVers: props["gfx_target_version"],
			arch:       gfxArch(props["gfx_target_version"]),
			cpuCores:   props["cpu_cores_count"],
			simd:       props["simd_count"],
			deviceID:   props["device_id"],
		})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].id < nodes[j].id })
	return nodes, nil
}

func readUint(path string) (uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(raw))
	if strings.HasPrefix(s, "0x") {
		return strconv.ParseUint(s[2:], 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}

// amdMemory reads the memory files of the PCI device at busID.
type amdMemory struct {
	vramTotal, vramUsed, gttTotal, gttUsed uint64
}

func readAMDMemory(root, busID string) (amdMemory, error) {
	dir := sysPath(root, pciDevices, busID)
	var m amdMemory
	var err error
	if m.vramTotal, err = readUint(filepath.Join(dir, "mem_info_vram_total")); err != nil {
		return m, fmt.Errorf("amdgpu %s: %w", busID, err)
	}
	if m.vramUsed, err = readUint(filepath.Join(dir, "mem_info_vram_used")); err != nil {
		return m, fmt.Errorf("amdgpu %s: %w", busID, err)
	}
	// GTT files are there on every amdgpu device; a kernel without them leaves GTT at 0
	m.gttTotal, _ = readUint(filepath.Join(dir, "mem_info_gtt_total"))
	m.gttUsed, _ = readUint(filepath.Join(dir, "mem_info_gtt_used"))
	return m, nil
}

// ListAMD returns the AMD GPUs: kfd topology nodes matched to amdgpu PCI devices by bus id.
// No kfd topology (no amdgpu driver) is ErrNoDevices.
func ListAMD(ctx context.Context, opts Options) ([]Device, error) {
	nodes, err := kfdGPUs(opts.SysRoot)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("amdgpu: no kfd topology: %w", ErrNoDevices)
	}
	if err != nil {
		return nil, fmt.Errorf("amdgpu: %w", err)
	}
	driver := "amdgpu"
	if v, err := os.ReadFile(sysPath(opts.SysRoot, "sys/module/amdgpu/version")); err == nil {
		driver = "amdgpu " + strings.TrimSpace(string(v))
	}
	var out []Device
	for i, n := range nodes {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		dir := sysPath(opts.SysRoot, pciDevices, n.busID)
		if vendor, err := readUint(filepath.Join(dir, "vendor")); err != nil || vendor != amdVendor {
			return nil, fmt.Errorf("amdgpu: kfd node %d at %s: no AMD PCI device there", n.id, n.busID)
		}
		m, err := readAMDMemory(opts.SysRoot, n.busID)
		if err != nil {
			return nil, err
		}
		name := ""
		if raw, err := os.ReadFile(filepath.Join(dir, "product_name")); err == nil {
			name = strings.TrimSpace(string(raw))
		}
		if name == "" {
			name = fmt.Sprintf("AMD GPU 0x%04x", n.deviceID)
		}
		d := Device{
			Backend: BackendHIP, Index: i, Name: name, Arch: n.arch, PCIBusID: n.busID,
			VRAMTotal: m.vramTotal, VRAMUsed: m.vramUsed, GTTTotal: m.gttTotal, GTTUsed: m.gttUsed,
			Unified: n.cpuCores > 0 || (m.vramTotal < unifiedVRAM && m.gttTotal > m.vramTotal),
			Driver:  driver,
		}
		d.TotalBytes, d.UsedBytes = m.vramTotal, m.vramUsed
		if d.Unified {
			d.TotalBytes += m.gttTotal
			d.UsedBytes += m.gttUsed
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("amdgpu: %w", ErrNoDevices)
	}
	return out, nil
}

// amdReader reads an amdgpu device's used memory from sysfs (VRAM, plus GTT when unified).
type amdReader struct {
	root, busID string
	unified     bool
}

func (r *amdReader) Used(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m, err := readAMDMemory(r.root, r.busID)
	if err != nil {
		return 0, err
	}
	if r.unified {
		return m.vramUsed + m.gttUsed, nil
	}
	return m.vramUsed, nil
}

func (r *amdReader) Name() string {
	if r.unified {
		return "amdgpu sysfs vram+gtt " + r.busID
	}
	return "amdgpu sysfs vram " + r.busID
}
