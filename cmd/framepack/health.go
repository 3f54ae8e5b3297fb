package main

import (
	"context"
	"fmt"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// cmdHealth asks the server's gRPC health service whether it serves (the containers'
// HEALTHCHECK, like grpc_health_probe): exit 0 and "SERVING" when it does, exitUnhealthy and
// the status with the server's reason ("NOT_SERVING: no variant can run: …") when it answers
// anything else, exitUnreachable when it cannot be reached in --timeout.
func cmdHealth(ctx context.Context, e *env, args []string) error {
	var c common
	fs := newFlags("health", e, &c)
	service := fs.String("service", "", "the health service name to check (\"\": the whole server)")
	fs.Lookup("timeout").DefValue = "5s"
	if err := fs.Set("timeout", "5s"); err != nil {
		return err
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fail(exitUsage, "health: unexpected arguments %q", pos)
	}
	conn, err := dial(e, &c)
	if err != nil {
		return err
	}
	defer conn.Close()
	hctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{Service: *service})
	if err != nil {
		return err
	}
	if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
		fmt.Fprintln(e.stdout, resp.GetStatus())
		return nil
	}
	// Health has no room for a reason: ListDevices says why the server does not serve.
	line := resp.GetStatus().String()
	if devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(hctx, &framepackv1.ListDevicesRequest{}); err == nil && devs.GetNotServingReason() != "" {
		line += ": " + devs.GetNotServingReason()
	}
	fmt.Fprintln(e.stdout, line)
	return fail(exitUnhealthy, "")
}
