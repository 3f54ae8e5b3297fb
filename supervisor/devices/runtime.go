package devices

// The host/container runtime check: the probe worker reports the GPU runtime it links (the
// container's CUDA or ROCm) and what the host driver serves; a pair that cannot work holds the
// lanes of that backend at start, with a message naming both versions and the fix, instead
// of letting the first job crash (ROCm 6.4 in a container on a ROCm 6.1 host driver crashed in
// cleanup, issue 22).

import (
	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/gpuversion"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// versionsOf turns the probe's report into gpuversion's; unparsable versions stay unknown.
func versionsOf(r *workerkit.RuntimeVersions) gpuversion.Versions {
	v := gpuversion.Versions{Backend: r.Backend, RuntimeSource: r.RuntimeSource, DriverSource: r.DriverSource}
	v.Runtime, _ = gpuversion.Parse(r.RuntimeVersion)
	v.Driver, _ = gpuversion.Parse(r.DriverVersion)
	return v
}

// CheckRuntime judges the runtime/driver pair of p's last probe and, when it cannot work,
// holds every lane of its backend through hold (allow: log it and keep the lanes). Lanes of
// other backends go on.
func CheckRuntime(p *Prober, lanes []string, allow bool, hold func(lane, reason string), log *logrus.Entry) {
	r := p.Runtime()
	if r == nil {
		return
	}
	v := versionsOf(r)
	f := log.WithFields(logrus.Fields{"backend": v.Backend, "runtime": r.RuntimeVersion, "driver": r.DriverVersion,
		"runtime_source": r.RuntimeSource, "driver_source": r.DriverSource})
	err := gpuversion.Check(v)
	if err == nil {
		f.Info("gpu runtime and host driver")
		return
	}
	if allow {
		f.WithError(err).Warn("gpu runtime mismatch; lanes kept (--allow-runtime-mismatch)")
		return
	}
	for _, lane := range lanes {
		if BackendOf(lane) != v.Backend {
			continue
		}
		hold(lane, "runtime mismatch: "+err.Error()+" (or start with --allow-runtime-mismatch)")
		f.WithField("lane", lane).WithError(err).Error("gpu runtime mismatch: lane held")
	}
}
