package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// cmdUnload kills the model workers the server keeps alive between jobs (JobSpec.keep_alive,
// framepackd --keep-alive), so their memory is free at once: every kept worker, or those of
// the models named, on every lane or the one given.
func cmdUnload(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("unload", e, &c)
	var lane string
	fs.StringVar(&lane, "lane", "", "only this lane (see framepack devices)")
	models, err := parse(fs, args)
	if err != nil {
		return err
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	uctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := framepackv1.NewDeviceServiceClient(conn).UnloadModels(uctx, &framepackv1.UnloadModelsRequest{Lane: lane, Models: models})
	if err != nil {
		return err
	}
	if len(resp.GetUnloaded()) == 0 {
		fmt.Fprintln(e.stdout, "no kept worker to unload")
		return nil
	}
	for _, u := range resp.GetUnloaded() {
		fmt.Fprintf(e.stdout, "unloaded %s on %s\n", u.GetModel(), u.GetLane())
	}
	return nil
}

// keptWorkers describes a lane's kept workers for devices: "transformer 30.1 GiB (4m left),
// vae 9.2 GiB".
func keptWorkers(ks []*framepackv1.KeptWorker, now time.Time) string {
	parts := make([]string, 0, len(ks))
	for _, k := range ks {
		p := k.GetModel() + " " + gib(k.GetCapBytes())
		if t := k.GetExpireTime(); t != nil {
			p += fmt.Sprintf(" (%s left)", max(t.AsTime().Sub(now), 0).Round(time.Second))
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}
