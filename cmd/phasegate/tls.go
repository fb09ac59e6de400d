package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
)

// tlsFlags are a server's TLS settings.
type tlsFlags struct {
	cert, key, clientCA string
	insecure            bool
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.cert, "tls-cert", "", "PEM certificate for the port (gRPC and HTTP)")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.clientCA, "tls-client-ca", "", "PEM CA bundle: the Slots API then requires client certificates it signed (mutual TLS); health stays open")
	fs.BoolVar(&f.insecure, "insecure", false, "allow a non-loopback --listen without TLS")
}

// config loads the files. It returns nil without --tls-cert.
func (f *tlsFlags) config() (*tls.Config, error) {
	switch {
	case f.cert == "" && f.key == "" && f.clientCA == "":
		return nil, nil
	case f.cert == "" || f.key == "":
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	cert, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if f.clientCA != "" {
		pool, err := loadPool(f.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		cfg.ClientCAs = pool
	}
	return cfg, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// clientTLSFlags are a client's TLS settings (status, probe).
type clientTLSFlags struct {
	ca, cert, key, serverName string
}

func (f *clientTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.ca, "tls-ca", "", "PEM CA bundle that signed the daemon's certificate: connect with TLS")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM client certificate, for a daemon that requires one")
	fs.StringVar(&f.key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&f.serverName, "tls-server-name", "", "name to verify the daemon's certificate against (default: the --addr host)")
}

// config returns nil for plain text (no --tls-ca).
func (f *clientTLSFlags) config() (*tls.Config, error) {
	if f.ca == "" {
		if f.cert != "" || f.key != "" {
			return nil, errors.New("--tls-cert needs --tls-ca")
		}
		return nil, nil
	}
	pool, err := loadPool(f.ca)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: f.serverName, MinVersion: tls.VersionTLS12}
	if f.cert != "" || f.key != "" {
		cert, err := tls.LoadX509KeyPair(f.cert, f.key)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
