package main

// TLS and the bearer token for a framepackd --listen beyond loopback (--tls-cert, --tls-key,
// --token-file on the daemon). The CLI reads them from the environment so that every command
// takes them without new flags: envconfig.TLSCA (a CA to trust), envconfig.TLS (the system's
// roots) and envconfig.TokenFile (the bearer token), declared with their docs in
// internal/envconfig.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/framepackd/framepackd/internal/apiaddr"
	"github.com/framepackd/framepackd/internal/envconfig"
)

// transportOptions are the dial options for a: plain text on a unix socket, TLS and the token on
// TCP as the environment says.
func transportOptions(a apiaddr.Addr) ([]grpc.DialOption, error) {
	if a.Network != "tcp" {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, nil
	}
	var opts []grpc.DialOption
	secure := false
	switch ca := envconfig.TLSCA.Get(); {
	case ca != "":
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envconfig.TLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", envconfig.TLSCA, ca)
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
		secure = true
	case envconfig.TLS.On():
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})))
		secure = true
	default:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if f := envconfig.TokenFile.Get(); f != "" {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", envconfig.TokenFile, err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: strings.TrimSpace(string(raw)), secure: secure}))
	}
	return opts, nil
}

// bearer sends "authorization: Bearer <token>" with every call.
type bearer struct {
	token  string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity keeps the token off plain-text connections unless TLS is off on
// purpose (loopback).
func (b bearer) RequireTransportSecurity() bool { return b.secure }
