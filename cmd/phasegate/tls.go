package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/phasegate/phasegate/app"
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

// config loads the files, read through files (an upgrade hands the new
// image what it read at SIGHUP). It returns nil without --tls-cert.
func (f *tlsFlags) config(files *app.ConfigFiles) (*tls.Config, error) {
	switch {
	case f.cert == "" && f.key == "" && f.clientCA == "":
		return nil, nil
	case f.cert == "" || f.key == "":
		return nil, errors.New("--tls-cert and --tls-key go together")
	}
	certPEM, err := files.ReadFile(f.cert, readPEMFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	keyPEM, err := files.ReadFile(f.key, readPEMFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-key: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if f.clientCA != "" {
		pem, err := files.ReadFile(f.clientCA, readPEMFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool, err := parsePool(f.clientCA, pem)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		cfg.ClientCAs = pool
	}
	return cfg, nil
}

// maxPEMFile bounds a certificate, key or CA bundle file: a system's whole
// CA bundle is a few hundred KiB.
const maxPEMFile = 4 << 20

// readPEMFile reads a PEM file of the daemon's: a regular file (through
// links: a Kubernetes Secret's files are links) of at most maxPEMFile
// bytes. Opened without blocking, so that a FIFO put at the path is
// refused, not waited on, at a start and at an upgrade's SIGHUP alike.
func readPEMFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > maxPEMFile {
		return nil, fmt.Errorf("%s: %d bytes, larger than %d", path, st.Size(), maxPEMFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxPEMFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPEMFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxPEMFile)
	}
	return b, nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parsePool(path, pem)
}

// parsePool parses the PEM CA bundle read from path.
func parsePool(path string, pem []byte) (*x509.CertPool, error) {
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
