// Package testcerts makes a throwaway certificate authority with server and
// client certificates, for tests of TLS and mutual TLS on loopback.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Set is a CA and two certificates it signed.
type Set struct {
	// CAPool trusts the CA.
	CAPool *x509.CertPool
	// Server is valid for 127.0.0.1, ::1 and localhost; Client for client
	// authentication.
	Server, Client tls.Certificate
	// PEM files written by WriteFiles.
	CAFile, ServerCert, ServerKey, ClientCert, ClientKey string

	caPEM, serverPEM, serverKeyPEM, clientPEM, clientKeyPEM []byte

	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// New makes a fresh CA and certificates valid for an hour.
func New() (*Set, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "phasegate test CA"},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	s := &Set{CAPool: x509.NewCertPool(), caPEM: pemBlock("CERTIFICATE", caDER), caCert: caCert, caKey: caKey, serial: 3}
	s.CAPool.AddCert(caCert)

	issue := func(serial int64, tmpl *x509.Certificate) (tls.Certificate, []byte, []byte, error) {
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Minute), now.Add(time.Hour)
		return s.sign(tmpl)
	}
	s.Server, s.serverPEM, s.serverKeyPEM, err = issue(2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "phasegate"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	s.Client, s.clientPEM, s.clientKeyPEM, err = issue(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "sandbox-scheduler"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	return s, nil
}

// Issue signs a client certificate from tmpl (its subject, SANs and
// validity; a zero validity is the next hour) with the set's CA and writes
// its certificate and key as name.pem and name-key.pem into dir. It is
// for tests of which identities a server accepts: a SPIFFE ID, an expired
// certificate, one that names nobody.
func (s *Set) Issue(dir, name string, tmpl *x509.Certificate) (cert tls.Certificate, certFile, keyFile string, err error) {
	s.serial++
	tmpl.SerialNumber = big.NewInt(s.serial)
	if tmpl.NotAfter.IsZero() {
		tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Minute), time.Now().Add(time.Hour)
	}
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	c, certPEM, keyPEM, err := s.sign(tmpl)
	if err != nil {
		return tls.Certificate{}, "", "", err
	}
	certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return tls.Certificate{}, "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, "", "", err
	}
	return c, certFile, keyFile, nil
}

// sign makes a fresh key and a certificate of it from tmpl, signed by the
// CA.
func (s *Set) sign(tmpl *x509.Certificate) (tls.Certificate, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.caCert, &key.PublicKey, s.caKey)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	certPEM, keyPEM := pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER)
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	return c, certPEM, keyPEM, err
}

// WriteFiles writes the CA, server and client PEM files into dir and
// records their paths in s.
func (s *Set) WriteFiles(dir string) error {
	files := []struct {
		path *string
		name string
		data []byte
	}{
		{&s.CAFile, "ca.pem", s.caPEM},
		{&s.ServerCert, "server.pem", s.serverPEM},
		{&s.ServerKey, "server-key.pem", s.serverKeyPEM},
		{&s.ClientCert, "client.pem", s.clientPEM},
		{&s.ClientKey, "client-key.pem", s.clientKeyPEM},
	}
	for _, f := range files {
		*f.path = filepath.Join(dir, f.name)
		if err := os.WriteFile(*f.path, f.data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
