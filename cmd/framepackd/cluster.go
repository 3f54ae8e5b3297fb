package main

// The cluster flags: --cluster joins a cluster of daemons sharing one queue on NATS JetStream
// (supervisor/cluster).

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/sirupsen/logrus"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/cluster"
)

// clusterOptions are the cluster flags.
type clusterOptions struct {
	url      string
	node     string
	prefix   string
	ackWait  time.Duration
	replicas int
	creds    string
	ca       string
}

// addClusterFlags registers the cluster flags on fs.
func addClusterFlags(fs *flag.FlagSet) *clusterOptions {
	o := &clusterOptions{}
	fs.StringVar(&o.url, "cluster", "", "join a cluster of daemons sharing one job queue on NATS JetStream: nats://HOST:4222[,nats://…] (default: a single host, jobs in the state directory)")
	fs.StringVar(&o.node, "cluster-node", "", "this daemon's name in the cluster (default: host name and process id)")
	fs.StringVar(&o.prefix, "cluster-prefix", cluster.DefaultPrefix, "name prefix of the cluster's JetStream streams and buckets (several clusters on one NATS)")
	fs.DurationVar(&o.ackWait, "cluster-ack-wait", cluster.DefaultAckWait, "how long a daemon that stopped answering keeps its running job before another daemon takes it over")
	fs.IntVar(&o.replicas, "cluster-replicas", cluster.DefaultReplicas, "copies JetStream keeps of the cluster's queue, jobs and files (3 on a 3-server NATS cluster)")
	fs.StringVar(&o.creds, "cluster-creds", "", "NATS credentials file (a user JWT and seed) for the cluster's servers")
	fs.StringVar(&o.ca, "cluster-tls-ca", "", "CA certificate (PEM) the cluster's NATS servers' TLS certificates are checked against")
	return o
}

// check refuses values the cluster cannot use.
func (o *clusterOptions) check() error {
	switch {
	case o.url == "":
		return nil
	case o.ackWait < time.Second:
		return fmt.Errorf("--cluster-ack-wait must be at least 1s, got %v", o.ackWait)
	case o.replicas < 1 || o.replicas > 5:
		return fmt.Errorf("--cluster-replicas must be 1 to 5, got %d", o.replicas)
	}
	return nil
}

// join joins the cluster when --cluster is set; nil without it.
func (o *clusterOptions) join(ctx context.Context, state string, observe func(*framepackv1.JobEvent), log *logrus.Logger) (*cluster.Cluster, error) {
	if o.url == "" {
		return nil, nil
	}
	var opts []nats.Option
	if o.creds != "" {
		opts = append(opts, nats.UserCredentials(o.creds))
	}
	if o.ca != "" {
		opts = append(opts, nats.RootCAs(o.ca))
	}
	c, err := cluster.Join(ctx, cluster.Config{URL: o.url, Node: o.node, StateDir: state, Prefix: o.prefix,
		AckWait: o.ackWait, Replicas: o.replicas, Options: opts, Observe: observe, Log: log})
	if err != nil {
		return nil, err
	}
	return c, nil
}
